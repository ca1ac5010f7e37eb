#!/usr/bin/env bash
# The layering rules of scripts/include-graph.sh: they hold for this tree
# (with the CPU-backend symbol check on the build's objects), and the
# checker does catch each kind of break, on small made-up trees.
#
#   bash tests/scripts/include_graph.sh SOURCE_DIR BUILD_DIR
set -u
SRC=$(cd "${1:?source dir}" && pwd)
BUILD=$(cd "${2:?build dir}" && pwd)
CHECK=$SRC/scripts/include-graph.sh
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$(bash "$CHECK" "$SRC" "$BUILD" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "the layering rules are broken in $SRC (exit $rc)"
echo "$out" | grep -q '^  plan  *-> backends' || fail "the folder graph lacks plan -> backends"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# A tree that keeps every rule: case NAME adds one break to a copy of it.
base() {
    rm -rf "$T/t"
    mkdir -p "$T/t"/{src/core,src/ir,src/ops,src/plan,src/backends/cpu,include/tessel,tools}
    cd "$T/t" || exit 2
    echo '#include "tessel/status.h"' > src/core/core.h
    echo '/* status */' > include/tessel/status.h
    echo '#include "core/core.h"' > src/ir/ir.h
    printf '#include "ir/ir.h"\n#include "core/core.h"\n' > src/ops/op.h
    echo '#include "core/core.h"' > src/backends/backend.h
    printf '#include "backends/backend.h"\nint ts_cpu_run(void) { return 0; }\n' \
        > src/backends/cpu/exec.c
    printf '#include "backends/backend.h"\n#include "ops/op.h"\n' > src/plan/plan.h
    printf '#include "plan.h"\nint ts_plan_step(void) { return 0; }\n' > src/plan/plan.c
    echo '#include "tessel/status.h"' > tools/main.c
}
# expect_break RULE WHAT: the checker exits 1 naming rule RULE.
expect_break() {
    local o r
    o=$(bash "$CHECK" "$T/t" 2>&1)
    r=$?
    [ $r -eq 1 ] || fail "$2: exit $r, want 1"
    echo "$o" | grep -q "BROKEN: $1 " || fail "$2: rule $1 not reported: $o"
}

base
o=$(bash "$CHECK" "$T/t" 2>&1) || fail "the clean made-up tree is reported broken: $o"
base && echo '#include "ops/op.h"' >> src/backends/cpu/exec.c
expect_break 1 "a backend reaching the IR through ops/op.h"
base && echo '#include "plan/plan.h"' >> src/backends/backend.h
expect_break 6 "backends <-> plan"
base && echo '#include "plan/plan.h"' >> src/backends/backend.h
expect_break 1 "backend.h including the plan"
base && echo 'int f(void) { return ts_cpu_run(); }' >> src/plan/plan.c
expect_break 2 "the plan calling a CPU-backend function"
base && echo '#include "backends/cpu/exec.c"' >> src/plan/plan.c
expect_break 2 "the plan including the CPU backend"
base && echo '#include "ops/op.h"' >> src/ir/ir.h
expect_break 3 "the IR including ops"
base && echo '#include "core/core.h"' >> tools/main.c
expect_break 4 "a tool including src/"
base && echo '#include "core/core.h"' >> include/tessel/status.h
expect_break 5 "a public header including src/"
# a loop through three folders, none of them including the next's includer directly
base && mkdir -p src/a src/b && echo '#include "b/b.h"' > src/a/a.h &&
    echo '#include "core/core.h"' > src/b/b.h && echo '#include "a/a.h"' >> src/core/core.h
expect_break 6 "core -> a -> b -> core"

[ $fails -eq 0 ] && echo "include graph: all checks passed"
exit $((fails > 0))
