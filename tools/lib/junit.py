#!/usr/bin/env python3
"""Counts Boost.Test cases in JUnit XML files (standard library only).

  junit.py count FILE     prints "passed failed skipped" (exit 2 if FILE is unreadable)
  junit.py bep FILE       reads a Bazel --build_event_json_file, finds every test
                          target and its test.xml, prints a per-target table and, as
                          the last line, "N passed, N failed, N skipped"; exit 1 if a
                          case failed, a test target did not run or failed without a
                          failing case in its XML, or no case was found.

A case with <skipped/> is skipped; with <failure> or <error>, failed; else passed.
"""
import json
import sys
import xml.etree.ElementTree as ET
from urllib.parse import unquote, urlparse


def count(path):
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    return passed, failed, skipped


def bep(path):
    tests = []  # test labels in BEP order
    results = {}  # (label, run, shard) -> (status, xml path); the last attempt wins
    with open(path) as f:
        for line in f:
            event = json.loads(line)
            eid = event.get("id", {})
            if "targetConfigured" in eid and "testSize" in event.get("configured", {}):
                tests.append(eid["targetConfigured"]["label"])
            elif "testResult" in eid and "testResult" in event:
                r = eid["testResult"]
                xml = None
                for out in event["testResult"].get("testActionOutput", []):
                    if out.get("name") == "test.xml":
                        xml = unquote(urlparse(out["uri"]).path)
                status = event["testResult"].get("status", "NO_STATUS")
                results[(r["label"], r.get("run", 1), r.get("shard", 1))] = (status, xml)

    total = [0, 0, 0]
    bad = False
    rows = []
    for label in tests:
        mine = [v for k, v in sorted(results.items()) if k[0] == label]
        counts = [0, 0, 0]
        note = ""
        if not mine:
            counts[1] += 1
            note = "did not run (build failure?): counted as 1 failed"
        for status, xml in mine:
            try:
                p, f, s = count(xml)
            except Exception as e:  # missing or truncated XML: the binary crashed
                counts[1] += 1
                note = "%s, unreadable test.xml (%s): counted as 1 failed" % (status, type(e).__name__)
                continue
            counts[0] += p
            counts[1] += f
            counts[2] += s
            if status not in ("PASSED", "FLAKY") and f == 0:
                counts[1] += 1
                note = "%s without a failing case: counted as 1 failed" % status
        if counts[1]:
            bad = True
        rows.append((label, counts, note))
        total = [a + b for a, b in zip(total, counts)]

    if rows:
        width = max(len(r[0]) for r in rows)
        print("%-*s %7s %7s %7s" % (width, "test", "passed", "failed", "skipped"))
        for label, (p, f, s), note in rows:
            print("%-*s %7d %7d %7d%s" % (width, label, p, f, s, "  " + note if note else ""))
    if sum(total) == 0:
        print("no test case found")
        bad = True
    print("%d passed, %d failed, %d skipped" % tuple(total))
    return 1 if bad else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "count":
        try:
            print("%d %d %d" % count(argv[2]))
        except Exception as e:
            print("cannot read %s: %s" % (argv[2], e), file=sys.stderr)
            return 2
        return 0
    if len(argv) == 3 and argv[1] == "bep":
        return bep(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
