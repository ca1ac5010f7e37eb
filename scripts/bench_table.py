"""bench_table.py — turn `tessel bench --json` lines into the table of
docs/benchmarks.md (between the bench-table markers). Called by
scripts/bench-table.sh:

    python3 scripts/bench_table.py RESULTS.jsonl DOC DATE COMMIT CPU NCPU LOAD_BEFORE LOAD_AFTER \
        [CPU_FLAGS THREADS [PIN]]

A row per JSON line, with its thread count; every PyTorch mode's throughput
(the fastest is the ratio's reference) and, where `tessel bench` measured
it (W1, W3), the step's GFLOP/s as a share of the GEMM ceiling of the same
run and compute type.
"""
import json, sys
path, doc, date, commit, cpu, ncpu, lb, la = sys.argv[1:9]
flags = sys.argv[9] if len(sys.argv) > 9 else "not recorded"
threads = sys.argv[10] if len(sys.argv) > 10 else "2"
pinned = len(sys.argv) > 11 and sys.argv[11] == "1"
rows = [json.loads(l) for l in open(path) if l.strip()]
# Issue #25: against the best PyTorch 2.x mode of the same precision.
target = {("W1", "fp32"): "≥ 1.5×", ("W2", "fp32"): "≥ 1.5×", ("W3", "fp32"): "≥ 1.5×",
          ("W4", "fp32"): "≥ 1.5×", ("W5", "fp32"): "≥ 2.5×", ("W1", "bf16"): "≥ 2×",
          ("W3", "bf16"): "≥ 1.5×"}
name = {"W1": "W1 MLP, batch 256", "W2": "W2 GRU, batch 128 × 64 steps",
        "W3": "W3 GPT, 8 × 256 tokens", "W4": "W4 3D U-Net, batch 4 × 32³",
        "W5": "W5 GCN, 20 000 nodes", "gpt2-124m": "GPT-2 124M, 4 × 64 tokens"}
versions = sorted({r["torch"].get("version") or "not probed" for r in rows if r.get("torch")})
out = [f"Measured {date} on {cpu} ({ncpu} CPUs; flags: {flags}), commit {commit}, "
       f"thread counts {threads}{' (1-thread runs of both sides pinned to CPU 0)' if pinned else ''}; "
       f"load average {lb} before, {la} after. "
       f"PyTorch {', '.join(versions) or '—'}: the reference script in every mode its version has "
       "(eager, torch.compile, compiled optimizer step; for bf16, autocast eager and compiled), "
       "each alternating with tessel in the same run; the ratio is against the fastest mode, "
       "named in the table. W3 and gpt2-124m: 5 timed steps per round after 1 warm-up step, W4 5 "
       "timed steps. The non-GEMM share counts convolutions as GEMM. On a loaded machine "
       "the absolute times and the non-GEMM share grow. GEMM ceiling: oneDNN's matmul alone on "
       "the workload's linear-layer shapes in the step's compute type, measured in the same run.", "",
       "| workload | precision | threads | tessel step | tessel throughput | fastest PyTorch mode | PyTorch step "
       "| PyTorch throughput | every PyTorch mode | ratio (target) | peak RSS tessel / PyTorch "
       "| non-GEMM share of tessel's step | tessel step vs GEMM ceiling |",
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    t, p = r["tessel"], r.get("torch")
    thr = f'{t["throughput"]:,.0f} {r["unit"]}'.replace(",", " ")
    if p:
        mode = p.get("mode", "eager")
        pstep, pthr = f'{p["step_ms"]:.1f} ms', f'{p["throughput"]:,.0f} {r["unit"]}'.replace(",", " ")
        tgt = target.get((r["workload"], r["precision"]), "—")
        ratio = f'**{r["ratio"]:.2f}×** ({tgt})'
        rss = f'{t["peak_rss_mb"]:.0f} / {p["peak_rss_mb"]:.0f} MB ({t["peak_rss_mb"] / p["peak_rss_mb"]:.2f}×)'
    else:
        mode = pstep = pthr = "no reference"
        ratio = "—"
        rss = f'{t["peak_rss_mb"]:.0f} MB / —'
    modes = " / ".join(f'{m["mode"]} {m["throughput"]:,.0f}'.replace(",", " ")
                       for m in (p or {}).get("modes", [])) or "—"
    ceil = r.get("gemm_ceiling_gflops")
    if ceil and t["step_ms"] > 0 and r.get("flops_per_step"):
        gf = r["flops_per_step"] / (t["step_ms"] * 1e-3) * 1e-9
        ceiling = f'{gf:.1f} of {ceil:.1f} GFLOP/s ({100 * gf / ceil:.1f} %)'
    else:
        ceiling = "—"
    out.append(f'| {name.get(r["workload"], r["workload"])} | {r["precision"]} | {r.get("threads", "?")} '
               f'| {t["step_ms"]:.1f} ms | {thr} | {mode} | {pstep} | {pthr} | {modes} | {ratio} | {rss} '
               f'| {100 * (1 - t["gemm_share"]):.1f} % | {ceiling} |')
text = open(doc).read()
b, e = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
if b not in text or e not in text:
    sys.exit(f"bench-table: {doc} has no {b} ... {e} section")
head, rest = text.split(b, 1)
_, tail = rest.split(e, 1)
open(doc, "w").write(head + b + "\n" + "\n".join(out) + "\n" + e + tail)
print("\n".join(out))
