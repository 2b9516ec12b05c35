#!/usr/bin/env python3
"""tiderec against its PyTorch eager reference, side by side, in one run.

Runs `tiderec bench dlrm` (or `tiderec bench model --model M`) with `--json`
and `scripts/torch_reference.py` on the same model, batch size and step
counts, with PyTorch's intra-op threads equal to tiderec's workers,
alternating the two for `--rounds` rounds (the first of a pair changes every
round), and prints a markdown table: the machine, each round's samples/s of
both, the medians and the ratio tiderec / PyTorch of the medians (with the
lowest and highest per-round ratio), and both sides' parameter counts.

A side that fails (tiderec rejecting `--device`, torch missing, a crash) is
shown in the table with its error, and the command exits with status 1.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("dlrm", "deepfm", "dien"), default="dlrm")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=1, help="tiderec workers = PyTorch threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N], passed to both")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default max(200000 / batch, 50))")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rows", type=int, default=100_000, help="rows per table (dlrm, deepfm)")
    p.add_argument("--optimizer", choices=("adagrad", "adam", "sgd"), default="adagrad", help="dense optimizer")
    p.add_argument("--tiderec", default=os.path.join(ROOT, "target", "release", "tiderec"))
    p.add_argument("--python", default=sys.executable, help="interpreter with torch")
    p.add_argument("--compile", action="store_true", help="torch.compile the PyTorch side (default: eager)")
    p.add_argument("--precision", choices=("fp32", "bf16", "tf32"), default="fp32",
                   help="bf16: tiderec --precision bf16 against PyTorch's forward under torch.autocast(bfloat16); "
                        "tf32 (GPU): tiderec --precision tf32 against PyTorch with TF32 matrix products")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.batch_size < 1 or a.workers < 1:
        p.error("--rounds, --batch-size and --workers must be positive")
    if a.steps is None:
        a.steps = max(200_000 // a.batch_size, 50)
    return a


def tiderec_command(a):
    if a.model == "dlrm":
        cmd = [a.tiderec, "bench", "dlrm"]
    else:
        cmd = [a.tiderec, "bench", "model", "--model", a.model]
    cmd += ["--batch-size", str(a.batch_size), "--workers", str(a.workers), "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--rows", str(a.rows), "--optimizer", a.optimizer, "--json"]
    if a.device != "cpu":
        cmd += ["--device", a.device]
    if a.precision != "fp32":
        cmd += ["--precision", a.precision]
    return cmd


def torch_command(a):
    cmd = [a.python, os.path.join(ROOT, "scripts", "torch_reference.py"), "--model", a.model,
           "--batch-size", str(a.batch_size), "--threads", str(a.workers), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--rows", str(a.rows), "--optimizer", a.optimizer, "--device", a.device,
           "--json"]
    if a.compile:
        cmd.append("--compile")
    if a.precision != "fp32":
        cmd += ["--precision", a.precision]
    return cmd


def run_json(cmd, timeout):
    """The last JSON object the command prints, or an error string."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, f"{cmd[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if out.returncode != 0:
        lines = [l for l in (out.stderr + out.stdout).strip().splitlines() if l.strip()]
        # tiderec's error line comes before a backtrace, when one is printed.
        errors = [l for l in lines if l.startswith("Error")]
        return None, f"exit {out.returncode}: {(errors or lines or ['no output'])[-1 if not errors else 0]}"
    for line in reversed(out.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), None
            except json.JSONDecodeError:
                break
    return None, "printed no JSON"


def cpu_model():
    """The first CPU's model name with its family and model numbers, which tell CPU generations apart where a
    virtual machine shows only the vendor's product line (`AMD EPYC (family 25, model 17)`)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name", "unknown")
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def fmt(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else x


def alternate(a, sides):
    """`a.rounds` rounds of every command in `sides` (name -> command), the
    first of a round rotating; per round a dict of the 1-minute load average
    before it (`load`) and, per side, its JSON object or its error string."""
    names = list(sides)
    rounds = []
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        row = {"load": os.getloadavg()[0]}
        for side in order:
            res, err = run_json(sides[side], a.timeout)
            row[side] = res if res is not None else err
            done = f"{res['samples_per_sec']:.0f} samples/s" if res and "samples_per_sec" in res else "done"
            print(f"round {r + 1} {side}: " + (done if res else err), file=sys.stderr)
        rounds.append(row)
    return rounds


def main(argv=None):
    a = parse_args(argv)
    sides = {"tiderec": tiderec_command(a), "torch": torch_command(a)}
    rounds = alternate(a, sides)

    ok = {s: [r[s] for r in rounds if isinstance(r[s], dict)] for s in sides}
    torch_info = ok["torch"][0] if ok["torch"] else {}
    tide_info = ok["tiderec"][0] if ok["tiderec"] else {}
    print(f"**{a.model}**, batch {a.batch_size}, {a.workers} tiderec workers / {a.workers} PyTorch threads, "
          f"device `{a.device}`, {a.warmup} warm-up + {a.steps} timed steps, dense optimizer {a.optimizer}, "
          f"embeddings row-wise Adagrad" +
          {"fp32": "",
           "bf16": ", precision bf16 (tiderec `--precision bf16`; PyTorch `torch.autocast(bfloat16)` on the dense model)",
           "tf32": ", precision tf32 (tiderec `--precision tf32`; PyTorch with TF32 matrix products)"}[a.precision])
    print()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)" +
          (f"; device: {torch_info['device_name']}" if a.device != "cpu" and torch_info else "") +
          (f"; torch {torch_info['torch_version']} (OMP_WAIT_POLICY={torch_info.get('omp_wait_policy')}, "
           f"fused dense optimizer: {'yes' if torch_info.get('fused_optimizer') else 'no'}"
           f"{', torch.compile' if torch_info.get('compile') else ', eager'})" if torch_info else ""))
    print()
    print("| round | tiderec samples/s | PyTorch eager samples/s | tiderec / PyTorch | load (1 min) |")
    print("|---|---:|---:|---:|---:|")
    ratios = []
    for i, row in enumerate(rounds):
        t, p = row["tiderec"], row["torch"]
        tv = t["samples_per_sec"] if isinstance(t, dict) else f"failed: {t}"
        pv = p["samples_per_sec"] if isinstance(p, dict) else f"failed: {p}"
        ratio = ""
        if isinstance(t, dict) and isinstance(p, dict):
            ratios.append(tv / pv)
            ratio = f"{tv / pv:.2f}×"
        print(f"| {i + 1} | {fmt(tv)} | {fmt(pv)} | {ratio} | {row['load']:.1f} |")
    med = {s: statistics.median([x["samples_per_sec"] for x in ok[s]]) if ok[s] else None for s in sides}
    if med["tiderec"] and med["torch"]:
        spread = f" (rounds {min(ratios):.2f}–{max(ratios):.2f})" if ratios else ""
        print(f"| median | {fmt(med['tiderec'])} | {fmt(med['torch'])} | "
              f"**{med['tiderec'] / med['torch']:.2f}×**{spread} | |")
    print()
    if tide_info or torch_info:
        td = (tide_info.get("dense_params"), tide_info.get("embedding_params"))
        pd = (torch_info.get("dense_params"), torch_info.get("embedding_params"))
        same = "equal" if td == pd and None not in td else "DIFFERENT"
        print(f"Parameters (dense + embedding): tiderec {td[0]} + {td[1]}, PyTorch {pd[0]} + {pd[1]} ({same}).")
        if torch_info:
            print(f"PyTorch loss, first vs last pass over its {torch_info['pool']} batches: "
                  f"{torch_info['loss_first']:.4f} → {torch_info['loss_last']:.4f}; on a held-out batch "
                  f"{torch_info['heldout_loss_before']:.4f} → {torch_info['heldout_loss_after']:.4f}.")
    failed = [s for s in sides if len(ok[s]) < a.rounds]
    if failed:
        print()
        print("Failed: " + ", ".join(f"{s} (`{' '.join(sides[s])}`)" for s in failed))
        return 1
    if tide_info and torch_info and td != pd:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
