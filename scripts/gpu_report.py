#!/usr/bin/env python3
"""The GPU check's report: one markdown page from the logs of `run OUTDIR` (the bundle
of `scripts/gpu_bundle.sh`).

    python3 scripts/gpu_report.py OUTDIR [OUTDIR ...] > docs/benchmarks-gpu.md

Several OUTDIRs (calls of `run` on one machine, e.g. with different `BENCHES`) are read in
order; a file present in more than one is taken from the last. Reads `machine.txt`,
`test-*.log` (run with `--nocapture`, so the passing tests' printed figures are there),
`bench-*.md` (from `scripts/bench_vs_torch.py`) and `stages-dlrm-*.json` (`tiderec bench
dlrm --json`), `hotrows-dlrm-*.json` (the same with `--zipf`), `graphs-dlrm-*.json` (with and without CUDA graphs), `readahead-dlrm-*.json` (`tiderec train --metrics-json`, reading ahead or in place), `hostthreads-dlrm-*.json` (two GPU workers, their host work on the cores' share or one thread), `auc-*.json` (`tiderec train --metrics-json`). Prints nothing it did not find in the logs, except the published fp32 peak
of the GPU named in the GEMM bound, which it says is published, not measured.
"""

import json
import os
import re
import sys

from benchmarks import table  # the same markdown tables as docs/benchmarks.md

# Dense products of DLRM's Kaggle shape per trained sample, forward and backward
# (6 · Σ in·out over both MLPs, less the first layer's dx), in MFLOP.
DLRM_MFLOP = 2.84
# Published dense fp32 (non-tensor-core) peaks, TFLOP/s, of the SXM parts.
FP32_PEAK_TFLOPS = {"H100": 67.0, "H200": 67.0}
# The precisions of the bundle's runs, in the order the tables list them.
PRECISIONS = ("fp32", "tf32", "bf16")


def files(dirs):
    """name -> path, the last directory winning."""
    out = {}
    for d in dirs:
        for name in sorted(os.listdir(d)):
            out[name] = os.path.join(d, name)
    return out


def runs(dirs, found):
    """Which call of `run` each log of the page comes from, and whether that call ran the last call's build."""
    def build(d):
        summary = os.path.join(d, "summary.txt")
        first = read(summary).splitlines()[:1] if os.path.exists(summary) else []
        m = re.match(r"bundle (\S+)", first[0]) if first else None
        return m.group(1) if m else None
    last = build(dirs[-1])
    rows = []
    for k, d in enumerate(dirs, 1):
        used = sorted(n for n, p in found.items() if os.path.dirname(p) == d and
                      re.match(r"(test-|bench-|cpu-bench-|cpu-kernels-|stages-|phases-|ncu-|hotrows-|graphs-|readahead-|hostthreads-).*\.(log|md|json|csv)$", n))
        if used:
            same = build(d) is not None and build(d) == last
            rows.append([f"{k}", "the last call's" if same else "an earlier one", ", ".join(f"`{u}`" for u in used)])
    return table(["call", "build", "logs used"], rows) if len(dirs) > 1 else ""


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def machine(found):
    text = read(found["machine.txt"]) if "machine.txt" in found else ""
    gpu = re.search(r"^(NVIDIA [^,\n]+), ([0-9.]+), (\d+) MiB", text, re.M)
    cuda = re.search(r"CUDA Version: ([0-9.]+)", text)
    cpu = re.search(r"model name\s*:\s*(.+)", text)
    cores = re.search(r"nproc: (\d+)", text)
    amx = re.search(r"amx_tile cpus: (\d+)", text)
    torch = re.search(r"^torch (\S+)", text, re.M)
    rows = [
        ("GPU", f"{gpu.group(1)}, {int(gpu.group(3)):,} MiB" if gpu else "not found in machine.txt"),
        ("driver, CUDA", f"{gpu.group(2) if gpu else '?'}, CUDA {cuda.group(1) if cuda else '?'}"),
        ("host CPU", f"{cpu.group(1).strip() if cpu else '?'}, {cores.group(1) if cores else '?'} cores, "
                     f"AMX {'yes' if amx and int(amx.group(1)) > 0 else 'no'}"),
        ("PyTorch", torch.group(1) if torch else "?"),
    ]
    return gpu.group(1) if gpu else "", table(["", ""], rows)


def tests(found):
    rows, errors, diffs, adaptive, resident = [], [], [], [], []
    passed = failed = 0
    for name in sorted(n for n in found if n.startswith("test-") and n.endswith(".log")):
        text = read(found[name])
        m = re.search(r"test result: (\w+)\. (\d+) passed; (\d+) failed", text)
        if m:
            passed += int(m.group(2))
            failed += int(m.group(3))
        rows.append([f"`{name[5:-4]}`", m.group(2) if m else "?", m.group(3) if m else "?",
                     "ok" if m and m.group(1) == "ok" else "**FAILED**"])
        # (device error, the CPU's own fp32 error against the fp64 model, where measured that way)
        errors += [(float(e), float(c) if c else None) for e, c in
                   re.findall(r"relative error ([0-9.e+-]+) over \d+ values(?: \(the CPU's fp32: ([0-9.e+-]+)\))?", text)]
        resident += [(float(p), float(l)) for p, l in
                     re.findall(r": params L2 \S+ vs CPU \S+: relative ([0-9.e+-]+); largest loss difference ([0-9.e+-]+)", text)]
        diffs += [float(x) for x in re.findall(r": \w+ \S+ vs \S+ \(rel ([0-9.e+-]+)\)", text)]
        adaptive += re.findall(r"^(\S+), default optimizers, params_l2 rel diff: gpu vs cpu (\S+), "
                               r"portable cpu kernels vs cpu (\S+)$", text, re.M)
    return passed, failed, table(["test executable", "passed", "failed", ""], rows), errors, diffs, adaptive, resident


def benches(found):
    rows = []
    for name in sorted(n for n in found if n.startswith("bench-") and n.endswith(".md")):
        text = read(found[name])
        head = re.search(r"^\*\*(\w[\w-]*)\*\*, batch (\d+)", text, re.M)
        med = re.search(r"^\| median \| ([\d,]+) \| ([\d,]+) \| \*\*([0-9.]+)×\*\* \(rounds ([0-9.]+)–([0-9.]+)\)",
                        text, re.M)
        rounds = len(re.findall(r"^\| \d+ \|", text, re.M))
        if not head:
            continue
        model, batch = head.group(1), int(head.group(2))
        prec = re.search(r", precision (\w+) \(tiderec", text)
        precision = prec.group(1) if prec else "fp32"
        key = (model, batch, PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS))
        if med:
            rows.append((key, [model, f"{batch:,}", precision, med.group(1), med.group(2),
                               f"**{med.group(3)}×** ({med.group(4)}–{med.group(5)})", rounds]))
        else:
            rows.append((key, [model, f"{batch:,}", precision, "failed: see the log", "", "", rounds]))
    rows.sort(key=lambda r: r[0])
    return [r[1] for r in rows]


def aucs(found):
    """Rows of step 3c's `auc-criteo-<precision>-<seed>.json` and `auc-synthetic-<precision>.json`
    (`tiderec train --metrics-json` on one GPU worker): per precision, the Criteo sample's AUC and
    logloss per seed and their mean, and the synthetic stream's AUC beside its teacher's."""
    rows = []
    for p in PRECISIONS:
        crit = []
        for name in sorted(n for n in found if re.match(rf"auc-criteo-{p}-\d+\.json$", n)):
            try:
                d = json.loads(read(found[name]))
                auc, logloss = float(d["auc"]), float(d["logloss"])
                crit.append((int(re.search(r"-(\d+)\.json$", name).group(1)), auc, logloss))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        syn = None
        if f"auc-synthetic-{p}.json" in found:
            try:
                syn = json.loads(read(found[f"auc-synthetic-{p}.json"]))
            except ValueError:
                syn = None
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
        if not isinstance(syn, dict) or not all(number(syn.get(k)) for k in ("auc", "samples_per_sec")):
            syn = None
        if not crit and not syn:
            continue
        crit.sort()
        mean = (sum(a for _, a, _ in crit) / len(crit)) if crit else None
        rows.append([p,
                     f"**{mean:.4f}**" if mean is not None else "",
                     ", ".join(f"{a:.4f}" for _, a, _ in crit),
                     f"{sum(lo for _, _, lo in crit) / len(crit):.4f}" if crit else "",
                     f"{syn['auc']:.4f} (teacher {syn['teacher_auc']:.4f})" if syn and number(syn.get("teacher_auc")) else "",
                     f"{syn['samples_per_sec']:,.0f}" if syn else ""])
    return rows


def cpu_benches(found):
    """Rows of `cpu-bench-<model>-<batch>-<precision>.md` (step 3b: the host CPU against PyTorch)."""
    rows = []
    for name in sorted(n for n in found if n.startswith("cpu-bench-") and n.endswith(".md")):
        m = re.match(r"cpu-bench-(\w+)-(\d+)-(\w+)\.md$", name)
        if not m:
            continue
        text = read(found[name])
        med = re.search(r"^\| median \| ([\d,]+) \| ([\d,]+) \| \*\*([0-9.]+)×\*\* \(rounds ([0-9.]+)–([0-9.]+)\)",
                        text, re.M)
        model, batch, precision = m.group(1), int(m.group(2)), m.group(3)
        if med:
            rows.append([model, f"{batch:,}", precision, med.group(1), med.group(2),
                         f"**{med.group(3)}×** ({med.group(4)}–{med.group(5)})"])
        else:
            rows.append([model, f"{batch:,}", precision, "failed: see the log", "", ""])
    return rows


def wide_layer(layer):
    """Whether a product's layer (`"512->256"`) has both widths of at least 64: DLRM's wide layers."""
    widths = [int(w) for w in layer.split("->")]
    return min(widths) >= 64


def cpu_kernels(path):
    """One `tiderec bench kernels --json` run of step 3h: (rows, peak, amx peak, bound share, product rows)."""
    d = json.loads(read(path))
    peak = max((r["gflops"] for r in d.get("fma_peak", [])), default=0.0)
    bound_share = d["gemm_bound_samples_per_sec"] / d["peak_bound_samples_per_sec"] if peak else 0.0
    products = []
    for p in d["products"]:
        if not wide_layer(p["layer"]):
            continue
        mm = next((c["gflops"] for c in p["candidates"] if c["kernel"] == "matrixmultiply"), None)
        products.append([f"{d['rows']:,}", p["product"], p["layer"].replace("->", "→"), p["mnk"], f"`{p['chosen']}`",
                         f"{p['chosen_gflops']:.1f}", f"**{p['chosen_gflops'] / peak:.0%}**" if peak else "",
                         f"{mm:.1f}" if mm else "", f"{p['chosen_gflops'] / mm:.2f}×" if mm else ""])
    return d, peak, d.get("amx_peak_gflops"), bound_share, products


def cpu_kernel_runs(found):
    """Step 3h's runs, fewest rows first."""
    names = [n for n in found if re.match(r"cpu-kernels-\d+\.json$", n)]
    return [cpu_kernels(found[n]) for n in sorted(names, key=lambda n: int(re.findall(r"\d+", n)[0]))]


def stages(found):
    rows = []
    for name in sorted(n for n in found if n.startswith("stages-dlrm-") and n.endswith(".json")):
        try:
            d = json.loads(read(found[name]))
        except ValueError:
            continue
        s = d["stage_ms"][0]
        if d.get("rows_on_device"):
            stage = ["", "", "", ""]
        else:
            stage = [f"{s[k]:.1f}" for k in ("plan", "serve", "forward_backward", "apply")]
        tiered = d.get("store") == "tiered"
        rows_at = "device" if d.get("rows_on_device") else \
            ("hot tier on device" if tiered else "own rows on device") if d.get("owned_rows_on_device") else \
            ("host (tiered)" if tiered else "host")
        rows.append([f"{d['batch_size']:,}", str(d.get("workers", 1)), rows_at,
                     f"{d['samples_per_sec']:,.0f}", f"{s['total']:.2f}"] + stage)
    rows.sort(key=lambda r: (int(r[0].replace(",", "")), r[1], r[2]))
    return rows


def phases(found):
    rows = []
    for name in sorted(n for n in found if n.startswith("phases-dlrm-") and n.endswith(".json")):
        try:
            d = json.loads(read(found[name]))
            p = d["phase_ms"]
        except (ValueError, KeyError):
            continue
        rows.append([f"{d['batch_size']:,}", f"{sum(p.values()):.2f}"] + [f"{v:.2f}" for v in p.values()])
    rows.sort(key=lambda r: int(r[0].replace(",", "")))
    return rows


def alternated(found, prefix, modes):
    """[batch, zipf, A samples/s, B samples/s, A / B, rounds] from `PREFIX-dlrm-BATCH-MODE-ROUND.json`
    for the two `modes` (A, B), medians over the rounds both ran; each row ends with the parsed runs of
    mode A (a dict by round), which the caller drops or reads."""
    import statistics
    runs = {}
    pattern = re.compile(rf"{re.escape(prefix)}-dlrm-(\d+)-({'|'.join(map(re.escape, modes))})-(\d+)\.json$")
    for name in found:
        m = pattern.match(name)
        if not m:
            continue
        try:
            d = json.loads(read(found[name]))
        except ValueError:
            continue
        # A run that failed or timed nothing pairs with no other: its round is left out alone.
        speed = d.get("samples_per_sec") if isinstance(d, dict) else None
        if not isinstance(speed, (int, float)) or speed <= 0:
            continue
        runs.setdefault(int(m.group(1)), {}).setdefault(m.group(2), {})[int(m.group(3))] = d
    rows = []
    for batch, by_mode in sorted(runs.items()):
        a, b = by_mode.get(modes[0], {}), by_mode.get(modes[1], {})
        paired = sorted(set(a) & set(b))
        if not paired:
            continue
        ratios = [a[r]["samples_per_sec"] / b[r]["samples_per_sec"] for r in paired]
        med = lambda side: statistics.median(side[r]["samples_per_sec"] for r in paired)
        rows.append([f"{batch:,}", f"{a[paired[0]].get('zipf', 0):g}", f"{med(a):,.0f}", f"{med(b):,.0f}",
                     f"**{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f})", f"{len(paired)}",
                     {r: a[r] for r in paired}])
    return rows


def hot_rows(found):
    """[batch, zipf, split samples/s, one-warp samples/s, split / one-warp, rounds] from
    `hotrows-dlrm-BATCH-MODE-ROUND.json`, medians over the rounds."""
    return [r[:-1] for r in alternated(found, "hotrows", ("split", "one-warp"))]


def graph_rows(found):
    """[batch, graphs samples/s, launches samples/s, graphs / launches, rounds, graph steps] from
    `graphs-dlrm-BATCH-MODE-ROUND.json` (MODE `on` or `off`), medians over the rounds; the last column
    gives the graphs the first `on` run captured and the steps it ran as graphs, warm-up included."""
    rows = []
    for r in alternated(found, "graphs", ("on", "off")):
        first = next(iter(r[-1].values()))
        counts = first.get("cuda_graphs") or {}
        failed = f", {counts['failed']} captures failed (graphs then off)" if counts.get("failed") else ""
        rows.append([r[0]] + r[2:6] + [f"{counts.get('captured', 0)} captured, {counts.get('replayed', 0)} steps "
                                       f"replayed (of {first.get('steps', 0)} timed and the warm-up){failed}"])
    return rows


def read_ahead_rows(found):
    """[batch, reading ahead samples/s, in place samples/s, ahead / in place, rounds, whole run samples/s,
    fixed s] from `readahead-dlrm-BATCH-MODE-ROUND.json` (`tiderec train --metrics-json` of the longer
    run, MODE `on` or `off`, its `samples_per_sec` the rate between a short and a long run); the last
    two are reading ahead's, medians over the rounds (blank from a bundle that ran one length)."""
    import statistics
    rows = []
    for r in alternated(found, "readahead", ("on", "off")):
        runs = list(r[-1].values())
        whole = [d["whole_run_samples_per_sec"] for d in runs if "whole_run_samples_per_sec" in d]
        fixed = [d["fixed_seconds"] for d in runs if isinstance(d.get("fixed_seconds"), (int, float))]
        rows.append(r[:1] + r[2:6] + [f"{statistics.median(whole):,.0f}" if whole else "",
                                      f"{statistics.median(fixed):.2f}" if fixed else ""])
    return rows


def host_thread_rows(found):
    """[batch, share samples/s, one thread samples/s, share / one thread, rounds, threads, plan ms,
    forward/backward ms] from `hostthreads-dlrm-BATCH-MODE-ROUND.json` (MODE `auto` or `1`); the stage
    times are worker 0's in the first round both ran, the cores' share first."""
    rows = []
    for r in alternated(found, "hostthreads", ("auto", "1")):
        share = r[-1]
        first = min(share)
        one = json.loads(read(found[f"hostthreads-dlrm-{r[0].replace(',', '')}-1-{first}.json"]))
        ms = lambda key: f"{share[first]['stage_ms'][0][key]:.1f} / {one['stage_ms'][0][key]:.1f}"
        rows.append([r[0]] + r[2:6] + [str(share[first].get("host_threads", "")), ms("plan"),
                                       ms("forward_backward")])
    return rows


def safe(build, found):
    """The rows `build(found)` gives, or none (and a warning on stderr naming the section) when an
    output it reads is not what it expects: one odd file never costs the rest of the report."""
    try:
        return build(found)
    except Exception as e:  # noqa: BLE001 - any malformed output
        print(f"warning: section {build.__name__} left out: {type(e).__name__}: {e}", file=sys.stderr)
        return []


def kernel_times(path):
    """(kernel, launches, total µs) from an `ncu --csv --metrics gpu__time_duration.sum` log, largest first."""
    import csv
    totals = {}
    try:
        lines = [l for l in read(path).splitlines() if l.startswith('"')]
    except OSError:
        return []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
        name = (row.get("Kernel Name") or "?").split("(")[0]
        n, t = totals.get(name, (0, 0.0))
        totals[name] = (n + 1, t + ns / 1e3)
    return sorted(((k, n, t) for k, (n, t) in totals.items()), key=lambda r: -r[2])


def main(argv):
    try:
        one_line(argv)
    except Exception as e:  # noqa: BLE001 - a summary line, never a traceback
        print(f"no result ({type(e).__name__}: {e})")
        return
    if argv[:1] in (["--kernels"], ["--cpu-kernels"], ["--hot-rows"], ["--graphs"], ["--host-threads"], ["--read-ahead"]):
        return
    page(argv)


def one_line(argv):
    """The summary line of a `--MODE OUTDIR [BATCH]` call of `run`, or nothing for the page's call."""
    if argv[:1] == ["--kernels"]:
        rows = kernel_times(argv[1])
        total = sum(r[2] for r in rows)
        print(f"{sum(r[1] for r in rows)} launches, {total:.0f} us; " +
              ", ".join(f"{k} {t:.0f} us ({n})" for k, n, t in rows[:6]))
        return
    if argv[:1] == ["--cpu-kernels"]:
        _, peak, amx, share, products = cpu_kernels(argv[1])
        low = min(products, key=lambda r: float(r[5]), default=None)
        print(f"FMA peak {peak:.1f} GFLOP/s" + (f", AMX bf16 peak {amx:.0f}" if amx else "") +
              f"; the chosen kernels' bound is {share:.0%} of the FMA peak" +
              (f"; the slowest wide-layer product {low[1]} {low[2]} at {low[6].strip('*')}" if low else ""))
        return
    if argv[:1] == ["--hot-rows"]:
        rows = [r for r in hot_rows(files(argv[1:2])) if r[0] == f"{int(argv[2]):,}"]
        print(f"split {rows[0][2]}, one warp {rows[0][3]}, split / one warp {rows[0][4]}" if rows else "no result")
        return
    if argv[:1] == ["--graphs"]:
        rows = [r for r in graph_rows(files(argv[1:2])) if r[0] == f"{int(argv[2]):,}"]
        print(f"graphs {rows[0][1]}, launches {rows[0][2]}, graphs / launches {rows[0][3]}; {rows[0][5]}"
              if rows else "no result")
        return
    if argv[:1] == ["--host-threads"]:
        rows = [r for r in host_thread_rows(files(argv[1:2])) if r[0] == f"{int(argv[2]):,}"]
        print(f"{rows[0][5]} threads {rows[0][1]}, one thread {rows[0][2]}, share / one {rows[0][3]}; plan ms "
              f"{rows[0][6]}, forward/backward ms {rows[0][7]}" if rows else "no result")
        return
    if argv[:1] == ["--read-ahead"]:
        rows = [r for r in read_ahead_rows(files(argv[1:2])) if r[0] == f"{int(argv[2]):,}"]
        print(f"reading ahead {rows[0][1]}, in place {rows[0][2]}, ahead / in place {rows[0][3]}"
              if rows else "no result")


def page(argv):
    """The page docs/benchmarks-gpu.md, from the folders `run` wrote."""
    if not argv or any(not os.path.isdir(d) for d in argv):
        sys.exit("usage: gpu_report.py OUTDIR [OUTDIR ...] (folders written by the bundle's `run`)")
    found = files(argv)
    gpu, machine_table = machine(found)
    passed, failed, test_table, errors, diffs, adaptive, resident = tests(found)
    print("# GPU results\n")
    print("Generated by `python3 scripts/gpu_report.py` from the logs of the GPU check bundle "
          "(`scripts/gpu_bundle.sh`, then `run OUTDIR` on the GPU machine); do not edit by hand. "
          "Every tiderec figure stands beside PyTorch's on the same GPU in the same call, alternated.\n")
    print("## Machine\n")
    print(machine_table + "\n")
    run_table = runs(argv, found)
    if run_table:
        print("## Runs\n")
        print("This page joins several calls of the bundle on this machine, in order; each log comes from the last "
              "call that wrote it, built from the code of the last call or from earlier code.\n")
        print(run_table + "\n")
    print("## Tests on the GPU\n")
    print(f"{passed} tests passed, {failed} failed, with `TIDEREC_REQUIRE_GPU=1` (a missing GPU fails them).\n")
    print(test_table + "\n")
    if errors:
        plain = [e for e, c in errors if c is None]
        exact = [(e, c) for e, c in errors if c is not None]
        print(f"Kernel and device-model conformance: {len(errors)} comparisons of a device result with its CPU "
              f"twin.")
        if plain:
            print(f"Kernels ({len(plain)}, against the CPU's fp32 result): the largest normwise relative error is "
                  f"**{max(plain):.1e}** (bound 1e-5).")
        if exact:
            over = [(e, c) for e, c in exact if e > 1e-5]
            print(f"Device models ({len(exact)}, layer by layer against the CPU model in fp64): the largest normwise "
                  f"relative error is **{max(e for e, _ in exact):.1e}**; the bound is 1e-5, or 4 times the CPU's own "
                  f"fp32 error where that is larger"
                  + (f" ({len(over)} comparisons above 1e-5, where the CPU's fp32 is off by up to "
                     f"{max(c for _, c in over):.1e}: cancelling sums of one value)" if over else "") + ".")
        print()
    if resident:
        print(f"Device-resident worker against one CPU worker (plain SGD, 50 steps, and batch 65,536 with a row "
              f"repeated 20,000 times): {len(resident)} comparisons, the largest relative difference of params L2 "
              f"**{max(p for p, _ in resident):.1e}** and of a step's loss **{max(l for _, l in resident):.1e}** "
              f"(bound 1e-4).\n")
    if diffs:
        print(f"GPU workers against CPU workers (params L2 and losses after 50 or 60 steps, plain SGD): "
              f"{len(diffs)} comparisons, the largest relative difference **{max(diffs):.1e}** (bound 1e-4).\n")
    if adaptive:
        print("With the default adaptive optimizers (Adam, row-wise Adagrad) two GPU runs are equal bit for bit; "
              "against a CPU worker, and beside two CPU kernel choices of the same CPU "
              "(`TIDEREC_MAX_ISA=portable` against the default), params L2 after 50 steps differs by:\n")
        print(table(["model", "GPU vs CPU", "CPU portable kernels vs CPU"], adaptive) + "\n")
    rows = safe(benches, found)
    if rows:
        print("## Speed against PyTorch eager on the same GPU\n")
        print("`scripts/bench_vs_torch.py --device cuda:0` (one tiderec GPU worker, the device-resident worker: "
              "rows, pooling, model and optimizers on the GPU, DIEN's behaviour sequences included. PyTorch eager "
              "with the same model, row-wise Adagrad rows and Adagrad dense; fp32 unless the precision column says "
              "otherwise), medians over the alternated rounds.\n")
        print(table(["model", "batch", "precision", "tiderec samples/s", "PyTorch samples/s", "tiderec / PyTorch",
                     "rounds"], rows) + "\n")
        if any(r[2] != "fp32" for r in rows):
            print("Precision tf32: tiderec `--precision tf32` (cuBLAS `CUBLAS_COMPUTE_32F_FAST_TF32`: TF32 tensor "
                  "cores on fp32 buffers) against PyTorch with `torch.backends.cuda.matmul.allow_tf32`; bf16: "
                  "tiderec `--precision bf16` (every GEMM's operands rounded to bf16, to nearest even, then "
                  "multiplied on the tensor cores with fp32 accumulation and fp32 results) against PyTorch's dense "
                  "model under `torch.autocast(bfloat16)`.\n")
    au = safe(aucs, found)
    if au:
        print("## AUC by precision on the GPU\n")
        print("`tiderec train --workers 1 --device cuda:0 --precision P` (one device-resident worker, the default "
              "optimizers). Criteo sample: `sample.train`, 8,000 rows train and 2,000 eval (`--eval-fraction "
              "0.2`), one epoch, batch 128, one run per seed; synthetic: the built-in stream (300,000 samples, "
              "batch 2,048), its teacher's AUC the best reachable.\n")
        print(table(["precision", "Criteo AUC, mean", "per seed (1, 2, 42)", "Criteo logloss, mean",
                     "synthetic AUC", "synthetic samples/s"], au) + "\n")
    for model, name, cmd in [("dlrm", "DLRM", "dlrm"), ("deepfm", "DeepFM", "model --model deepfm")]:
        log = f"ncu-{model}-16384.csv"
        ks = kernel_times(found[log]) if log in found else []
        if not ks:
            continue
        total = sum(r[2] for r in ks)
        print(f"## Kernels of a device-resident {name} step\n")
        print(f"Nsight Compute (`ncu --metrics gpu__time_duration.sum`), {sum(r[1] for r in ks)} consecutive "
              f"launches of `tiderec bench {cmd} --device cuda:0 --batch-size 16384` after its warm-up, each timed "
              f"alone: {total:,.0f} µs in all.\n")
        print(table(["kernel", "launches", "µs", "share"],
                    [[f"`{k}`", str(n), f"{t:,.0f}", f"{t / total:.0%}"] for k, n, t in ks]) + "\n")
    cpu = safe(cpu_benches, found)
    if cpu:
        print("## The host CPU against PyTorch\n")
        print("`scripts/bench_vs_torch.py --device cpu` on the GPU machine's host CPU, one tiderec worker against "
              "one PyTorch thread, alternated; bf16: tiderec `--precision bf16` against PyTorch's "
              "`torch.autocast(bfloat16)` on the dense model (oneDNN, on AMX where the CPU has it).\n")
        print(table(["model", "batch", "precision", "tiderec samples/s", "PyTorch samples/s", "tiderec / PyTorch"],
                    cpu) + "\n")
    kernels = safe(cpu_kernel_runs, found)
    if kernels:
        d = kernels[0][0]
        print("## The host CPU's GEMM kernels against the core's peaks\n")
        print(f"`tiderec bench kernels --rows R --rounds 3 --json` pinned to one core of the host CPU "
              f"({d['cpu']}; {d['features_line']}), the rest of the machine idle: DLRM's MLP products on every "
              "candidate kernel, medians over the alternated rounds. The bound is the samples/s one core could "
              "train if a step were only these products on the kernels training chooses, as a share of the same "
              "products at the core's fp32 fused multiply-add peak (independent FMA chains in registers, measured "
              "in the same run); the AMX peak is independent bf16 tile products.\n")
        print(table(["rows", "fp32 FMA peak GFLOP/s", "AMX bf16 peak GFLOP/s", "chosen kernels' bound",
                     "share of the FMA peak"],
                    [[f"{r[0]['rows']:,}", f"{r[1]:.1f}", f"{r[2]:.0f}" if r[2] else "no AMX",
                      f"{r[0]['gemm_bound_samples_per_sec']:,.0f} samples/s", f"**{r[3]:.0%}**"]
                     for r in kernels]) + "\n")
        print("The products of DLRM's wide layers (both widths at least 64): the chosen kernel's GFLOP/s, its "
              "share of the FMA peak, and matrixmultiply (the general-purpose baseline) in the same rounds.\n")
        print(table(["rows", "product", "layer", "m × n × k", "chosen kernel", "GFLOP/s", "share of the FMA peak",
                     "matrixmultiply GFLOP/s", "chosen / matrixmultiply"],
                    [p for r in kernels for p in r[4]]) + "\n")
    hot = safe(hot_rows, found)
    if hot:
        print("## Hot rows: a run of duplicates split into chunks against summed by one warp\n")
        print("`tiderec bench dlrm --device cuda:0 --zipf S --json`, one device-resident worker, every table's ids "
              "Zipf(S)-skewed (id 0 the most frequent), with the row update's long runs of duplicates split into "
              "chunks summed in parallel (the default) against every run summed in entry order by one warp "
              "(`TIDEREC_GPU_HOT_ROWS=one-warp`), alternated; medians over the rounds.\n")
        print(table(["batch", "zipf", "split samples/s", "one warp samples/s", "split / one warp", "rounds"], hot)
              + "\n")
    graphs = safe(graph_rows, found)
    if graphs:
        print("## CUDA graphs: a training step replayed as one graph against launched kernel by kernel\n")
        print("`tiderec bench dlrm --device cuda:0 --json`, one device-resident worker, uniform ids, with "
              "`TIDEREC_GPU_GRAPHS=on` (the default: each staging slot's step captured once per batch shape, then "
              "replayed) against `off` (the step's kernels launched one by one), alternated; medians over "
              "the rounds. Both give the same steps bit for bit (`graph_steps_equal_launched_steps_bit_for_bit`).\n")
        print(table(["batch", "graphs samples/s", "launches samples/s", "graphs / launches", "rounds",
                     "graphs used"], graphs) + "\n")
    ahead = safe(read_ahead_rows, found)
    if ahead:
        print("## The trainer reading its next micro-batch during the step\n")
        print("`tiderec train --device cuda:0 --workers 1` (one device-resident worker, DLRM, the synthetic "
              "stream made on the host's cores), each micro-batch made while the step before it runs "
              "(`--read-ahead on`, what `auto` chooses for a GPU worker) against made when its step starts "
              "(`--read-ahead off`), alternated; medians over the rounds. The trainer's whole step (not "
              "`bench`'s), ", end="")
        if any(r[6] for r in ahead):
            print("samples/s between a run of 20 steps and one of 320 (their samples' difference over their "
                  "training times' difference), so that a run's first steps weigh nothing; beside them, reading "
                  "ahead, the longer run's samples/s over its whole training time and what the short run took "
                  "beyond its steps at the rate between the two (its first steps' extra cost).\n")
            print(table(["batch", "reading ahead samples/s", "in place samples/s", "ahead / in place", "rounds",
                         "ahead, whole run samples/s", "ahead, fixed s"], ahead) + "\n")
        else:
            print("samples/s over one run's whole training time, its first steps included.\n")
            print(table(["batch", "reading ahead samples/s", "in place samples/s", "ahead / in place", "rounds"],
                        [r[:5] for r in ahead]) + "\n")
    hosts = safe(host_thread_rows, found)
    if hosts:
        print("## Two GPU workers' host work on their share of the cores against on one thread\n")
        print("`tiderec bench dlrm --device cuda:0 --workers 2 --json` (two GPU workers on one GPU, each "
              "keeping the rows it owns on the device), the planning, pooling and row-gradient sums on each "
              "worker's share of the host's cores (`TIDEREC_HOST_THREADS=auto`, the default) against on one "
              "thread (`1`), alternated; medians over the rounds. Plan and forward/backward: ms per step of "
              "worker 0 in the first round, the share's / one thread's.\n")
        print(table(["batch", "share samples/s", "one thread samples/s", "share / one thread", "rounds",
                     "threads", "plan ms", "forward/backward ms"], hosts) + "\n")
    ph = safe(phases, found)
    if ph:
        print("## Where a device-resident worker's step goes\n")
        print("`tiderec bench dlrm --device cuda:0 --phases --json`: ms per step in each phase, the host waiting "
              "for the device after each phase (so the sum exceeds an untimed step).\n")
        print(table(["batch", "sum", "host", "upload", "pool", "forward", "loss", "backward", "rows", "dense"], ph)
              + "\n")
    st = safe(stages, found)
    if st:
        print("## Where a GPU worker's step goes\n")
        print("`tiderec bench dlrm --device cuda:0 --json` (ms per step). Rows *device*: one device-resident "
              "worker (`tiderec_gpu::resident`: rows, pooling, the model and both optimizers on the GPU; only "
              "the step's total is timed). Rows *host* (`--host-rows`): GPU workers with their rows on the host, "
              "timed by the trainer's stage clock (worker 0's): planning, serving rows and applying row and dense updates run "
              "on the host; forward/backward includes the host's pooling and the copies to and from the device. "
              "Rows *own rows on device* (`--workers 2`, two GPU workers on one GPU): each serves and updates the "
              "rows it owns on the device (`tiderec_gpu::device_shard`), worker 0's stage clock; samples/s are both "
              "workers'. Rows *hot tier on device* (`--hot-rows 65536 --zipf 1.1`): one GPU worker under the tiered "
              "store on Zipf(1.1)-skewed ids, its hot tier on the device (`tiderec_gpu::device_hot_tier`) and the "
              "cold tier on the host; *host (tiered)* the same with every row on the host.\n")
        print(table(["batch", "GPU workers", "rows", "samples/s", "step", "plan", "serve", "forward/backward",
                     "apply"], st) + "\n")
        peak = next((v for k, v in FP32_PEAK_TFLOPS.items() if k in gpu), None)
        big = [r for r in st if r[0] == "65,536" and r[2] == "device"] or [r for r in st if r[0] == "65,536"]
        if peak and big:
            bound = peak * 1e12 / (DLRM_MFLOP * 1e6)
            torch_row = [r for r in rows if r[0] == "dlrm" and r[1] == "65,536" and r[2] == "fp32" and r[4]]
            torch_share = (f", PyTorch eager {float(torch_row[0][4].replace(',', '')) / bound:.1%} in the benchmark "
                           "above" if torch_row else "")
            print(f"At batch 65,536 the fp32 GEMM bound of DLRM ({DLRM_MFLOP} MFLOP per sample at the "
                  f"{gpu}'s published {peak:.0f} TFLOP/s fp32 peak, not measured here) is {bound / 1e6:.1f} M "
                  f"samples/s; tiderec reaches {float(big[0][3].replace(',', '')) / bound:.1%} of it"
                  f"{torch_share}.\n")


if __name__ == "__main__":
    main(sys.argv[1:])
