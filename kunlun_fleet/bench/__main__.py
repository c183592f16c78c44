"""python -m kunlun_fleet.bench render RUN_DIR

Reads RUN_DIR/raw.json (what roles/bench measured; RUN_DIR/results.json when there is no
raw.json), writes results.json, report.html and report.md there, and prints one line per
gate (PASS/FAIL ...) and the report's path. Runs in the bench venv (matplotlib)."""

import argparse
import os
import sys

from kunlun_fleet.bench import report, results


def render(run_dir):
    raw_path = os.path.join(run_dir, "raw.json")
    if os.path.exists(raw_path):
        res = results.build(results.load(raw_path))
    else:
        res = results.load(os.path.join(run_dir, "results.json"))
    results.write(res, run_dir)
    html_path, md_path = report.write_reports(res, run_dir)
    for g in res["gates"]:
        print(results.gate_line(g))
    for a in res["plan"]["answers"]:
        print("plan: " + a["text"])
    print("report: %s (%s, %s)" % (html_path, md_path, os.path.join(run_dir, "results.json")))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kunlun_fleet.bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="results.json, report.html and report.md of one run")
    r.add_argument("run_dir")
    args = ap.parse_args(argv)
    render(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
