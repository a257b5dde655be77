#!/usr/bin/env bash
# Commits real-model study runs as they finish, while `scripts/run_real_studies.py` makes them in a clean worktree of
# this repository (so that every run records a commit with no local changes):
#
#   git worktree add --detach ../studies-wt HEAD
#   (cd ../studies-wt && nohup python scripts/run_real_studies.py --only frontier_sum --jobs 2 >> ../runner.log 2>&1 &)
#   nohup bash scripts/commit_study_runs.sh ../studies-wt frontier_sum beta >> ../commits.log 2>&1 &
#
# Every INTERVAL seconds: each finished run of the named studies in the worktree (its runs.json) that this checkout
# lacks or holds differently is copied here with the files a study keeps (runs.json, summary.md, metrics.csv,
# completions.md), the studies' summaries are rewritten from every finished run (`--summarize`) and, with the frontier
# study among them, the studies page's frontier tables (`scripts/frontier_table.py --write`); then the pages' tests run
# (tests/test_docs.py, tests/demo/test_real_studies.py) and only if they pass are those paths committed, in one commit
# naming the runs and their minutes: other changes in this checkout are left alone (the studies page is committed
# whole). A run that joins a study can change numbers the page's text quotes (an arm reaching 2 seeds joins the
# frontier study's Holm family): then the tests fail, nothing is committed, the log says so, and the runs wait in this
# checkout for a person to update the text (the next run to land is tried with them).
set -uo pipefail
worktree="$(cd "$1" && pwd)"; shift
studies=("$@")
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
INTERVAL="${INTERVAL:-600}"
cd "$here"
pending=()
while true; do
    copied=()
    for study in "${studies[@]}"; do
        for source in "$worktree"/docs/studies/real/"$study"/runs/*/seed-*/runs.json; do
            [ -f "$source" ] || continue
            run="$(dirname "${source#"$worktree"/}")"
            if ! cmp -s "$source" "$run/runs.json"; then
                mkdir -p "$run"
                for file in runs.json summary.md metrics.csv completions.md; do
                    [ -f "$worktree/$run/$file" ] && cp "$worktree/$run/$file" "$run/$file"
                done
                copied+=("$run")
            fi
        done
    done
    pending+=("${copied[@]}")
    if [ ${#copied[@]} -gt 0 ]; then
        "$python" scripts/run_real_studies.py --summarize --only "${studies[@]}" > /dev/null
        paths=("${pending[@]}")
        for study in "${studies[@]}"; do paths+=("docs/studies/real/$study"); done
        if [[ " ${studies[*]} " == *" frontier "* ]]; then
            "$python" scripts/frontier_table.py --write > /dev/null
            paths+=("docs/studies/README.md")
        fi
        if ! "$python" -m pytest -q -p no:cacheprovider tests/test_docs.py tests/demo/test_real_studies.py \
            > "${TMPDIR:-/tmp}/commit_study_runs.pytest.log" 2>&1; then
            echo "[$(date +%H:%M)] held, not committed: the pages' tests fail with ${#pending[@]} new run(s)" \
                "(${TMPDIR:-/tmp}/commit_study_runs.pytest.log); the page's text needs updating"
            sleep "$INTERVAL"
            continue
        fi
        names=()
        for run in "${pending[@]}"; do
            minutes="$("$python" -c "import json,sys; print(f'{json.load(open(sys.argv[1]))[0][\"wall_time\"] / 60:.1f}')" \
                "$run/runs.json")"
            names+=("$(basename "$(dirname "$run")") $(basename "$run") ($minutes min)")
        done
        git add -- "${paths[@]}"
        message="$(IFS=';'; echo "${studies[*]// /, } studies: ${names[*]}; summaries regenerated")"
        git commit -q -m "${message//;/; }" -- "${paths[@]}" && echo "[$(date +%H:%M)] committed: ${names[*]}"
        pending=()
    fi
    sleep "$INTERVAL"
done
