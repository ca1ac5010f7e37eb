"""bench_table.py — turn `tessel bench --json` lines into the table of
docs/benchmarks.md (between the bench-table markers). Called by
scripts/bench-table.sh:

    python3 scripts/bench_table.py RESULTS.jsonl DOC DATE COMMIT CPU NCPU LOAD_BEFORE LOAD_AFTER \
        [CPU_FLAGS THREADS]
"""
import json, sys
path, doc, date, commit, cpu, ncpu, lb, la = sys.argv[1:9]
flags = sys.argv[9] if len(sys.argv) > 9 else "not recorded"
threads = sys.argv[10] if len(sys.argv) > 10 else "2"
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
       f"{threads} thread(s); load average {lb} before, {la} after. "
       f"PyTorch {', '.join(versions) or '—'}: the reference script in every mode its version has "
       "(eager, torch.compile, compiled optimizer step; for bf16, autocast eager and compiled), "
       "each alternating with tessel in the same run; the ratio is against the fastest mode, "
       "named in the table. W3 and gpt2-124m: 5 timed steps per round after 1 warm-up step, W4 5 "
       "timed steps. The non-GEMM share counts convolutions as GEMM. On a loaded machine "
       "the absolute times and the non-GEMM share grow.", "",
       "| workload | precision | tessel step | tessel throughput | fastest PyTorch mode | PyTorch step "
       "| PyTorch throughput | ratio (target) | peak RSS tessel / PyTorch | non-GEMM share of tessel's step |",
       "|---|---|---|---|---|---|---|---|---|---|"]
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
    out.append(f'| {name.get(r["workload"], r["workload"])} | {r["precision"]} | {t["step_ms"]:.1f} ms '
               f'| {thr} | {mode} | {pstep} | {pthr} | {ratio} | {rss} '
               f'| {100 * (1 - t["gemm_share"]):.1f} % |')
text = open(doc).read()
b, e = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
if b not in text or e not in text:
    sys.exit(f"bench-table: {doc} has no {b} ... {e} section")
head, rest = text.split(b, 1)
_, tail = rest.split(e, 1)
open(doc, "w").write(head + b + "\n" + "\n".join(out) + "\n" + e + tail)
print("\n".join(out))
