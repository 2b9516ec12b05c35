#!/usr/bin/env python3
"""Rewrite a tiderec Parquet file with pyarrow: another writer, same schema, one extra column.

Usage: parquet_rewrite_pyarrow.py IN.parquet OUT.parquet [ROW_GROUP_ROWS]

The output holds the same rows and the same `tiderec.schema` key-value metadata as
IN, but is written by pyarrow (snappy instead of zstd, pyarrow's own encodings and
row-group size), with its columns in reverse order and an extra string column
`source_note` first. tiderec's reader must give back exactly the same batches
(columns are matched by name; other columns are ignored). Used by
sources/tests/parquet_pyarrow.rs.
"""
import sys

import pyarrow as pa
import pyarrow.parquet as pq

KEY = b"tiderec.schema"


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    row_group_rows = int(sys.argv[3]) if len(sys.argv) == 4 else 1500
    description = pq.read_metadata(src).metadata[KEY]
    table = pq.read_table(src)
    table = table.select(list(reversed(table.column_names)))
    note = pa.array([f"row {i}" for i in range(table.num_rows)], type=pa.string())
    table = table.add_column(0, "source_note", note)
    table = table.replace_schema_metadata({KEY: description})
    pq.write_table(table, dst, row_group_size=row_group_rows, compression="snappy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
