#!/usr/bin/env bash
# The package as a user gets it: the built wheel installed (not editable) with its [verl] extra into a fresh venv,
# and with its [trl] extra (no verl, no Ray) into a second one; every command run from a folder outside the
# checkout. Fails on the first command that fails.
#   bash .ci/wheel.sh                 build, install and check in a temp folder (removed at the end)
#   bash .ci/wheel.sh build DIR       the wheel into DIR/dist (run it before anything else builds in the checkout)
#   bash .ci/wheel.sh install DIR     fresh venvs DIR/venv ([verl]) and DIR/venv-trl ([trl]) with torch and that
#                                     wheel (pip only: .ci/run runs it beside its own install and the suite, on the
#                                     core pip leaves idle)
#   bash .ci/wheel.sh check DIR       the checks, with those venvs
# PYTHON: the interpreter that builds (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { echo "ci wheel: $*"; }
start=$SECONDS
phase=${1:-all}
if [ "$phase" = all ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
else
  [ $# = 2 ] || { echo "usage: bash .ci/wheel.sh [build|install|check DIR]" >&2; exit 2; }
  mkdir -p "$2"
  WORK=$(cd "$2" && pwd)
fi
V="$WORK/venv/bin/python"
T="$WORK/venv-trl/bin/python"

if [ "$phase" = all ] || [ "$phase" = build ]; then
  "${PYTHON:-python3}" -m pip wheel -q --no-deps -w "$WORK/dist" .
  say "built $(basename "$WORK"/dist/ebpo_verl-*.whl) in $((SECONDS - start)) s"
fi
if [ "$phase" = all ] || [ "$phase" = install ]; then
  wheel=$(echo "$WORK"/dist/ebpo_verl-*.whl)
  for P in "$V" "$T"; do
    python3 -m venv --clear "$(dirname "$(dirname "$P")")"
    "$P" -m pip install -q --upgrade pip
    "$P" -m pip install -q torch==2.13.0  # the CPU build, without its index: .ci/run says why
    "$P" -c "import torch; v = torch.__version__; assert v == '2.13.0+cpu' and torch.version.cuda is None, v"
  done
  "$V" -m pip install -q -c .ci/constraints.txt "${wheel}[verl]"
  # pytest and its plugins (the test extra's pins): .ci/run runs tests/test_trl.py in this venv
  "$T" -m pip install -q -c .ci/constraints.txt "${wheel}[trl]" pytest==9.1.1 pytest-xdist==3.8.0 pytest-timeout==2.4.0
  say "installed $(basename "$wheel") with [verl], and with [trl] in a second venv, in $((SECONDS - start)) s"
fi
if [ "$phase" != all ] && [ "$phase" != check ]; then
  exit 0
fi
[ -x "$V" ] && [ -x "$T" ] || { say "no venvs in $WORK: run 'bash .ci/wheel.sh install $WORK' first"; exit 1; }

mkdir "$WORK/outside"
cd "$WORK/outside"
# the study's tiny preset (its report needs matplotlib and scipy: core dependencies), on one core beside the rest
"$V" -m ebpo_verl.study --preset tiny --out study > study.log 2>&1 &
study_pid=$!
trap 'kill $study_pid 2>/dev/null || true; [ "$phase" != all ] || rm -rf "$WORK"' EXIT
export WORK_DIR="$WORK/outside/ebpo_runs" PYTHON="$V" PATH="$WORK/venv/bin:$PATH"
"$V" - "$ROOT" <<'PY'
import importlib, pkgutil, sys
import ebpo_verl
checkout = sys.argv[1]
for pkg in (ebpo_verl,):
    assert "site-packages" in pkg.__file__ and not pkg.__file__.startswith(checkout), pkg.__file__
    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    names = [n for n in names if not n.startswith("ebpo_verl.integrations.")]  # [trl]: the second venv's check
    for name in names:
        importlib.import_module(name)  # the core install imports every module (extras are imported lazily)
    print(f"ci wheel: {len(names)} modules of {pkg.__name__} import from {pkg.__path__[0]}")
PY

# the planned commands: --list, a dry run of one run and of one table; every program and module they name exists
"$V" -m ebpo_verl.recipes table main --list > list.tsv
DRY_RUN=1 "$V" -m ebpo_verl.recipes run qwen3_8b > run.yaml 2> run.log
grep -q "DRY_RUN: pre-flight passed" run.log && grep -q "adv_estimator: ebpo" run.yaml
DRY_RUN=1 "$V" -m ebpo_verl.recipes table curriculum > table.out 2> table.log
[ "$(grep -c '   pre-flight: ok' table.log)" = 6 ]
"$V" "$ROOT/.ci/check_planned.py" "$ROOT" list.tsv run.log table.log
[ ! -e "$WORK_DIR" ] || { say "a dry run wrote $WORK_DIR"; exit 1; }
say "--list and the dry runs ok ($((SECONDS - start)) s)"

# [trl]: no verl, no Ray; the integration imports and finds its estimators; ebpo-train names [verl] in one line
"$T" -c "import importlib.util as u; assert not any(map(u.find_spec, ('verl', 'ray', 'hydra'))); \
from ebpo_verl.integrations.trl import lookup; [lookup(n) for n in ('ebpo', 'spo', 'dbb')]"
rc=0; out=$("$WORK/venv-trl/bin/ebpo-train" 2>&1) || rc=$?
if [ "$rc" != 2 ] || [ "$(wc -l <<< "$out")" != 1 ] || ! grep -qF "pip install 'ebpo-verl[verl]'" <<< "$out"; then
  say "[trl] venv: ebpo-train exited $rc: $out"; exit 1
fi
say "[trl] venv: no verl or Ray, the TRL integration imports, ebpo-train names [verl] ($((SECONDS - start)) s)"

# each command's --help: exit 0 and some text
helps=(
  "ebpo_verl.recipes run qwen3_8b --help" "ebpo_verl.recipes run qwen3_14b --help"
  "ebpo_verl.recipes run llama3_8b --help" "ebpo_verl.recipes eval --help"
  "ebpo_verl.recipes table main --help" "ebpo_verl.recipes table group_size --help"
  "ebpo_verl.recipes table ordering --help" "ebpo_verl.recipes table curriculum --help"
  "ebpo_verl.recipes table grpo_bn --help" "ebpo_verl.main --help"
  "ebpo_verl.evaluate --help" "ebpo_verl.evaluate generate --help" "ebpo_verl.evaluate grade --help"
  "ebpo_verl.evaluate.pass_rate --help" "ebpo_verl.recipes.make_tables --help"
  "ebpo_verl.recipes.plot_dynamics --help" "ebpo_verl.docs_tables --help"
  "ebpo_verl.study --help" "ebpo_verl.data.all --help" "ebpo_verl.data.label_topics --help"
  "ebpo_verl.smoke.selfcheck --help"
)
# two at a time (the study holds one core until it ends); the single quotes are sh -c's script, expanded there
# shellcheck disable=SC2016
printf '%s\n' "${helps[@]}" | xargs -P 2 -I{} sh -c 'out=$("$0" -m {}) && [ -n "$out" ] || { echo "ci wheel: python -m {} failed or printed nothing"; exit 255; }' "$V"
out=$(ebpo-train --help) && [ "${out%%$'\n'*}" != "" ] || { say "ebpo-train --help failed"; exit 1; }
# data_prep/ installed as the wheel's docs: its scripts run from there
out=$("$V" "$WORK/venv/share/doc/ebpo-verl/data_prep/all.py" --help) && [ -n "$out" ] \
  || { say "data_prep/all.py --help failed"; exit 1; }
say "${#helps[@]} + 1 --help commands ok ($((SECONDS - start)) s)"
# the proof harness (smoke runs, campaign) is the checkout's tests/harness/: the wheel's ebpo_verl.smoke names it
rc=0; out=$("$V" -m ebpo_verl.smoke 2>&1) || rc=$?
if [ "$rc" != 2 ] || [ "$(wc -l <<< "$out")" != 1 ] || ! grep -qF "python -m tests.harness" <<< "$out"; then
  say "python -m ebpo_verl.smoke exited $rc: $out"; exit 1
fi
! "$V" -c "import tests.harness" 2>/dev/null || { say "the wheel's venv imports tests.harness"; exit 1; }
say "python -m ebpo_verl.smoke names the harness in the checkout, which the wheel lacks"
wait "$study_pid" || { tail -20 study.log; say "study --preset tiny failed"; exit 1; }
say "study --preset tiny: $(find study -type f | wc -l) files; $((SECONDS - start)) s in all"
