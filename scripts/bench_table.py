"""bench_table.py — turn `tessel bench --json` lines into the table of
docs/benchmarks.md (between the bench-table markers). Called by
scripts/bench-table.sh:

    python3 scripts/bench_table.py RESULTS.jsonl DOC DATE COMMIT CPU NCPU LOAD_BEFORE LOAD_AFTER
"""
import json, sys
path, doc, date, commit, cpu, ncpu, lb, la = sys.argv[1:9]
rows = [json.loads(l) for l in open(path) if l.strip()]
target = {"W1": "≥ 1.8×", "W2": "≥ 2×", "W3": "≥ 1.6×", "W4": "≥ 1.5×", "W5": "≥ 2×",
          "gpt2-124m": "—"}
name = {"W1": "W1 MLP, batch 256", "W2": "W2 GRU, batch 128 × 64 steps",
        "W3": "W3 GPT, 8 × 256 tokens", "W4": "W4 3D U-Net, batch 4 × 32³",
        "W5": "W5 GCN, 20 000 nodes", "gpt2-124m": "GPT-2 124M, 4 × 64 tokens"}
out = [f"Measured {date} on {cpu} ({ncpu} CPUs), commit {commit}, "
       f"2 threads, fp32; load average {lb} before, {la} after. "
       "PyTorch: the reference script, eager fp32, alternating with tessel in the same run; "
       "W3 and gpt2-124m: 5 timed steps per round after 1 warm-up step, W4 5 timed steps. "
       "The non-GEMM share counts convolutions as GEMM. On a loaded machine "
       "the absolute times and the non-GEMM share grow, and PyTorch slows more than tessel.", "",
       "| workload | tessel step | tessel throughput | PyTorch step | PyTorch throughput "
       "| ratio (target) | peak RSS tessel / PyTorch | non-GEMM share of tessel's step |",
       "|---|---|---|---|---|---|---|---|"]
for r in rows:
    t, p = r["tessel"], r.get("torch")
    thr = f'{t["throughput"]:,.0f} {r["unit"]}'.replace(",", " ")
    if p:
        pstep, pthr = f'{p["step_ms"]:.1f} ms', f'{p["throughput"]:,.0f} {r["unit"]}'.replace(",", " ")
        ratio = f'**{r["ratio"]:.2f}×** ({target[r["workload"]]})'
        rss = f'{t["peak_rss_mb"]:.0f} / {p["peak_rss_mb"]:.0f} MB ({t["peak_rss_mb"] / p["peak_rss_mb"]:.2f}×)'
    else:
        pstep = pthr = "no reference"
        ratio = "—"
        rss = f'{t["peak_rss_mb"]:.0f} MB / —'
    out.append(f'| {name.get(r["workload"], r["workload"])} | {t["step_ms"]:.1f} ms | {thr} '
               f'| {pstep} | {pthr} | {ratio} | {rss} | {100 * (1 - t["gemm_share"]):.1f} % |')
text = open(doc).read()
b, e = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
if b not in text or e not in text:
    sys.exit(f"bench-table: {doc} has no {b} ... {e} section")
head, rest = text.split(b, 1)
_, tail = rest.split(e, 1)
open(doc, "w").write(head + b + "\n" + "\n".join(out) + "\n" + e + tail)
print("\n".join(out))
