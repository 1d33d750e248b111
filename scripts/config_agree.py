#!/usr/bin/env python3
"""Fail when --help, the start-up log and memtallyd.8 name different keys.

    scripts/config_agree.py MEMTALLYD MEMTALLYD.8

The configuration's keys are one table (server/config.c, mts_keys); three
places show it to people:

  - `memtallyd --help`: the lines under "Config file keys:", one
    `[section] key` each;
  - the start-up log: one `msg="config"` line per section, `key=value` for
    every key (the server is started with a config file that has a
    [group NAME] section, so those keys are logged too);
  - docs/memtallyd.8, section CONFIGURATION FILE: under each `.SS
    [section]`, the keys named in bold on the line after a `.TP`.

Each is read as a set of (section, key), [group NAME] for every group, and
the three must be equal. Prints what each lacks and exits 1 if any does.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def norm(section):
    return "group NAME" if section.startswith("group ") else section


def from_help(memtallyd):
    out = subprocess.run([memtallyd, "--help"], check=True,
                         capture_output=True, text=True).stdout
    keys, inside = set(), False
    for line in out.splitlines():
        if line.startswith("Config file keys:"):
            inside = True
            continue
        m = re.match(r"^  \[([^\]]+)\] ([a-z0-9_]+)", line)
        if inside and m:
            keys.add((norm(m.group(1)), m.group(2)))
    return keys


def from_log(memtallyd):
    with tempfile.TemporaryDirectory(prefix="mt-agree-") as d:
        conf = os.path.join(d, "memtallyd.conf")
        with open(conf, "w") as f:
            f.write("[limits]\nfleet = 1GiB\n[group agree]\nlimit = 512MiB\n")
        os.chmod(conf, 0o600)
        log = os.path.join(d, "log")
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [memtallyd, "--socket", os.path.join(d, "s.sock"),
                 "--label", f"mt-agree-{os.getpid()}", "--config", conf,
                 "--reset"], stderr=err)
        text = ""
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                with open(log) as f:
                    text = f.read()
                if 'msg="listening"' in text or proc.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        if 'msg="listening"' not in text:
            sys.exit(f"config_agree: memtallyd did not start:\n{text}")
    keys = set()
    field = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
    for line in text.splitlines():
        if 'msg="config"' not in line:
            continue
        fields = field.findall(line)
        section = dict(fields).get("section", "").strip('"')
        for k, _ in fields:
            if k not in ("ts", "level", "msg", "section"):
                keys.add((norm(section), k))
    return keys


def from_man(page):
    keys, section, inside, after_tp = set(), None, False, False
    with open(page, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(".SH"):
                inside = line.strip() == ".SH CONFIGURATION FILE"
                continue
            if not inside:
                continue
            m = re.match(r"^\.SS \[(.+)\]$", line)
            if m:
                section = norm(m.group(1))
                continue
            if line.startswith(".TP"):
                after_tp = True
                continue
            if after_tp and section and re.match(r"^\.(B|BR|BI) ", line):
                words = re.sub(r'"[^"]*"', " ", line).split()[1:]
                for w in words:
                    w = w.rstrip(",")
                    if KEY.match(w):
                        keys.add((section, w))
            after_tp = False
    return keys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    memtallyd, page = sys.argv[1], sys.argv[2]
    found = {"--help": from_help(memtallyd),
             "the start-up log": from_log(memtallyd),
             os.path.basename(page): from_man(page)}
    every = set().union(*found.values())
    bad = False
    for name, keys in found.items():
        if len(keys) < 60:
            print(f"FAIL: only {len(keys)} keys found in {name}")
            bad = True
        for section, key in sorted(every - keys):
            print(f"FAIL: {name} lacks [{section}] {key}")
            bad = True
    if not bad:
        print(f"{len(every)} keys, the same in " + ", ".join(found))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
