#!/usr/bin/env bash
# include-graph.sh — the include graph between the folders of src/, and the
# layering rules it must keep (issue #15). Prints the folder graph, then
# every broken rule; exits 1 if any rule is broken, 0 otherwise.
#
#   scripts/include-graph.sh [ROOT [BUILD_DIR]]
#
# ROOT is the repository (default: this script's parent folder). With
# BUILD_DIR (a CMake build of ROOT), the rule on CPU-backend symbols is also
# checked on the compiled objects with nm.
#
# Rules ("reaches" follows #include "..." transitively, files as the
# compiler finds them: beside the including file, then src/, include/):
#   1. no file of src/backends reaches src/ir, src/passes or src/plan;
#   2. no file of src/plan reaches src/backends/cpu or names a function or
#      object the CPU backend defines (ts_backend_cpu, ts_cpu_*, ts_mm_*, ...);
#   3. files of src/ir reach only src/ir, src/core and include/;
#   4. tools/*.c reach nothing in src/;
#   5. include/ (the public headers) reaches nothing in src/;
#   6. the folders of src/ (src/<folder>, subfolders counted as their
#      top folder) include each other without a loop. tools/ is left out;
#   7. no file of src/passes reaches src/backends (what a pass needs to know
#      of the backend comes through ts_pass_ctx, filled by the plan).
set -u
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${2:-}
cd "$ROOT" || exit 2

# One line per include edge: "FROM TO", both paths relative to ROOT.
edges() {
    local all
    all=$(find src include tools -type f \( -name '*.c' -o -name '*.h' -o -name '*.def' \) | sort)
    {
        printf 'FILE %s\n' $all
        grep -H '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $all |
            sed 's/^\([^:]*\):[^"]*"\([^"]*\)".*/INC \1 \2/'
    } | awk '
    function norm(p,   a, n, i, k, o) {
        n = split(p, a, "/"); k = 0
        for (i = 1; i <= n; i++) {
            if (a[i] == "." || a[i] == "") continue
            if (a[i] == ".." && k > 0) { k--; continue }
            o[++k] = a[i]
        }
        p = o[1]; for (i = 2; i <= k; i++) p = p "/" o[i]
        return p
    }
    $1 == "FILE" { have[$2] = 1; next }
    $1 == "INC" {
        dir = $2; sub(/\/[^\/]*$/, "", dir)
        n = split(dir "/" $3 " src/" $3 " include/" $3, c, " ")
        for (i = 1; i <= n; i++) if (norm(c[i]) in have) { print $2, norm(c[i]); break }
    }'
}

EDGES=$(edges)
# Source-level names the CPU backend defines: non-static functions and
# objects at the start of a line in src/backends/cpu/*.c.
CPU_SYMS=$(sed -n 's/^[A-Za-z_][A-Za-z0-9_ *]*[ *]\(ts_[A-Za-z0-9_]*\)[[:space:]]*[(=].*/\1/p' \
    src/backends/cpu/*.c 2>/dev/null | grep -v '^$' | sort -u)
PLAN_NAMES=""
if [ -n "$CPU_SYMS" ] && [ -d src/plan ]; then
    PLAN_NAMES=$(grep -owE "$(echo "$CPU_SYMS" | paste -sd'|')" src/plan/*.c src/plan/*.h \
        2>/dev/null | sort -u)
fi
# Object-level: symbols the plan's objects use that the CPU backend's define.
NM_HITS=""
if [ -n "$BUILD" ]; then
    OBJ=$BUILD/CMakeFiles/tessel_obj.dir/src
    if ls "$OBJ"/plan/*.o >/dev/null 2>&1 && ls "$OBJ"/backends/cpu/*.o >/dev/null 2>&1; then
        NM_HITS=$(comm -12 <(nm -u "$OBJ"/plan/*.o | awk 'NF { print $NF }' | sort -u) \
            <(nm --defined-only -g "$OBJ"/backends/cpu/*.o | awk 'NF == 3 { print $3 }' |
                sort -u))
    else
        echo "include-graph: no objects under $OBJ (build tessel_obj first)" >&2
        exit 2
    fi
fi

printf '%s\n' "$EDGES" | awk -v plan_names="$PLAN_NAMES" -v nm_hits="$NM_HITS" '
function folder(p,   a, n) {
    n = split(p, a, "/")
    if (a[1] == "src") return n > 2 ? a[2] : "src"
    return a[1]
}
function under(p, pre) { return substr(p, 1, length(pre)) == pre }
# Files reachable from f (into reach[f, g]), depth-first.
function walk(root, f,   k, g) {
    for (k = 1; k <= nout[f]; k++) {
        g = out[f, k]
        if ((root, g) in reach) continue
        reach[root, g] = 1
        walk(root, g)
    }
}
function bad(msg) { msgs[++nbad] = msg }
NF == 2 {
    from = $1; to = $2
    files[from] = 1; files[to] = 1
    out[from, ++nout[from]] = to
    fa = folder(from); fb = folder(to)
    if (fa != fb && fa != "tools" && fa != "include" && under(from, "src/")) {
        if (!((fa, fb) in fe)) { fe[fa, fb] = 0; order[++ne] = fa SUBSEP fb; ex[fa, fb] = from " -> " to }
        fe[fa, fb]++
        if (!(fa in isf)) { isf[fa] = 1; fl[++nf] = fa }
        if (!(fb in isf)) { isf[fb] = 1; fl[++nf] = fb }
    }
}
END {
    print "folder include graph (src/, includes across folders):"
    for (i = 1; i <= ne; i++) {
        split(order[i], ab, SUBSEP)
        printf "  %-10s -> %-10s %3d\n", ab[1], ab[2], fe[ab[1], ab[2]]
    }
    for (f in files) walk(f, f)
    print "rules:"
    for (k in reach) {
        split(k, fg, SUBSEP); f = fg[1]; g = fg[2]
        if (under(f, "src/backends/") &&
            (under(g, "src/ir/") || under(g, "src/passes/") || under(g, "src/plan/")))
            bad("1 backends reach the IR, passes or plan: " f " -> " g)
        if (under(f, "src/plan/") && under(g, "src/backends/cpu/"))
            bad("2 the plan reaches the CPU backend: " f " -> " g)
        if (under(f, "src/ir/") && !under(g, "src/ir/") && !under(g, "src/core/") &&
            !under(g, "include/"))
            bad("3 the IR reaches beyond src/core and include/: " f " -> " g)
        if (f ~ /^tools\/[^\/]*\.c$/ && under(g, "src/"))
            bad("4 a tool reaches src/: " f " -> " g)
        if (under(f, "include/") && under(g, "src/"))
            bad("5 a public header reaches src/: " f " -> " g)
        if (under(f, "src/passes/") && under(g, "src/backends/"))
            bad("7 a pass reaches the backends: " f " -> " g)
    }
    n = split(plan_names, nm1, "\n")
    for (i = 1; i <= n; i++) if (nm1[i] != "") bad("2 src/plan names a CPU-backend symbol: " nm1[i])
    n = split(nm_hits, nm2, "\n")
    for (i = 1; i <= n; i++)
        if (nm2[i] != "") bad("2 a src/plan object uses a CPU-backend symbol: " nm2[i])
    # 6: folder reachability (Floyd-Warshall over a few folders); a folder
    # pair reaching each other lies on a loop.
    for (i = 1; i <= ne; i++) { split(order[i], ab, SUBSEP); r[ab[1], ab[2]] = 1 }
    for (k = 1; k <= nf; k++) for (i = 1; i <= nf; i++) if ((fl[i], fl[k]) in r)
        for (j = 1; j <= nf; j++) if ((fl[k], fl[j]) in r) r[fl[i], fl[j]] = 1
    for (i = 1; i <= nf; i++) for (j = i + 1; j <= nf; j++)
        if ((fl[i], fl[j]) in r && (fl[j], fl[i]) in r)
            bad("6 include loop between folders " fl[i] " and " fl[j] \
                (((fl[i], fl[j]) in ex) ? " (" ex[fl[i], fl[j]] ")" : "") \
                (((fl[j], fl[i]) in ex) ? " (" ex[fl[j], fl[i]] ")" : ""))
    # sorted, so that the report reads the same every run
    for (i = 2; i <= nbad; i++)
        for (j = i; j > 1 && msgs[j - 1] > msgs[j]; j--) { t = msgs[j]; msgs[j] = msgs[j - 1]; msgs[j - 1] = t }
    for (i = 1; i <= nbad; i++) print "  BROKEN: " msgs[i]
    if (nbad) { print nbad " rule(s) broken"; exit 1 }
    print "  all hold"
}'
