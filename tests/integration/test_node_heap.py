"""An unmodified Node.js under the preload holding ~1.5 million JavaScript
objects is counted for its heap: V8 reserves its heap as PROT_NONE address
space and commits pages with mprotect, which the preload follows (a
reservation made writable is counted, one made inaccessible again is not).
memtally's figure grows within 15% of the growth of the process's
anonymous RSS, nearly all of it as `mapped`; when the program drops its
objects and V8 collects them, the figure does not stay above what the
process holds.

Node.js is a test dependency (scripts/deps.sh installs Debian's nodejs);
without it this test is skipped with the reason, never passed.
"""
import shutil

from harness import (MIB, Server, Skip, Worker, check, rss_anon, run,
                     wait_for)

SCRIPT = r"""
const fs = require("fs");
function anon() {
  const m = /RssAnon:\s+(\d+)/.exec(fs.readFileSync("/proc/self/status", "utf8"));
  return Number(m[1]) * 1024;
}
let held = null;
const lines = require("readline").createInterface({input: process.stdin});
const steps = [
  () => {
    held = [];
    for (let i = 0; i < 1500000; i++)
      held.push({a: i, b: "s" + i, c: [i, i + 1]});
    console.log("held " + anon());
  },
  () => {
    held = null;
    global.gc();
    global.gc();
    console.log("freed " + anon());
  },
  () => process.exit(0),
];
lines.on("line", () => steps.shift()());
console.log("base " + anon());
"""


def figure(s, pid):
    return s.ps().get(pid)


def test_v8_heap_counted():
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        raise Skip("no node or nodejs on PATH (scripts/deps.sh installs "
                   "Debian's nodejs)")
    with Server() as s:
        w = Worker([node, "--expose-gc", "-e", SCRIPT], s.env(group="node"))
        try:
            words = w.readline(timeout=60).split()
            check(words[0] == "base", f"base: {words}")
            base_rss = int(words[1])
            base = wait_for("registered", lambda: figure(s, w.pid))
            w.send("")
            words = w.readline(timeout=120).split()
            check(words[0] == "held", f"held: {words}")
            grown = int(words[1]) - base_rss
            check(grown >= 150 * MIB, f"holds over 150 MiB: RssAnon +{grown}")
            p = wait_for("counted", lambda: (lambda p: p if p and abs(
                (p["bytes"] - base["bytes"]) - grown) <= 0.15 * grown
                else None)(figure(s, w.pid)), timeout=10)
            print(f"  node: RssAnon +{grown / MIB:.1f} MiB, memtally "
                  f"+{(p['bytes'] - base['bytes']) / MIB:.1f} MiB "
                  f"({(p['bytes'] - base['bytes']) / grown:.3f}), of which "
                  f"mapped {p['mapped'] / MIB:.1f} MiB", flush=True)
            check(p["mapped"] >= 0.8 * grown,
                  f"V8's committed heap counted as mapped: {p}")
            w.send("")
            words = w.readline(timeout=60).split()
            check(words[0] == "freed", f"freed: {words}")
            # V8 keeps some of its pages committed after a collection;
            # what the figure must not do is count more than is held.
            after = wait_for("a tick after the collection", lambda: (
                lambda p: p if p and p["bytes"] <=
                rss_anon(w.pid) + 16 * MIB else None)(figure(s, w.pid)),
                timeout=10)
            print(f"  after gc(): memtally {after['bytes'] / MIB:.1f} MiB "
                  f"(mapped {after['mapped'] / MIB:.1f}), RssAnon "
                  f"{int(words[1]) / MIB:.1f} MiB", flush=True)
            w.send("")
        finally:
            w.close()


if __name__ == "__main__":
    run([test_v8_heap_counted])
