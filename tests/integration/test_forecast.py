"""Growth rate and time to limit, with real workers moving real memory at
known rates (mt_worker ramp, clock-driven):

- a worker growing at 40 MiB/s: the fleet's rate within 10% of it once a
  growth window has passed, and seconds_to_limit within 15% of the time the
  limit is then actually crossed (the `over` event's time); /metrics shows
  both and promtool accepts it;
- a flat worker reads 0 within 1 MiB/s and a shrinking one a negative rate,
  neither with a forecast (groups with limits, and their processes);
- three workers that allocate 200 MiB each at once and then hold still: a
  step is not growth, so neither the fleet nor their group (both with
  limits and a forecast_horizon) shows a forecast or turns `high`;
- with forecast_horizon, the fleet turns `high` below the watermark when
  the forecast says the limit is near: one Watch event with the reason;
  20 s of a noisy but flat figure before it change nothing. (Leaving
  `high` again is covered by tests/unit/test_server_rate.c: it takes a
  growth window past the horizon's margin, more wall time than it is
  worth here.)

Short growth windows (3-4 s) keep the file under a minute of wall time; the
rate code is the same at any window (tests/unit/test_server_rate.c)."""
import time

from harness import MIB, Server, Worker, check, run, wait_for, worker
from harness import config_file as config
from test_limits import Watcher
from test_metrics import get, metrics_url, parse, promtool, value


# The workers' figure is their heap alone: the rates here are the heap's,
# which the test drives; jemalloc's free pages, sampled on each worker's
# own clock, would move the figure after the heap stopped.
HEAP_ONLY = {"MEMTALLY_ALLOCATOR_FREE": "0"}


def ramp_worker(s, mib, group):
    w = Worker([*worker("ramp"), str(mib)], s.env(group=group, **HEAP_ONLY))
    check(w.readline().startswith("ready"), "worker not ready")
    wait_for(f"{group} counted", lambda: s.ps().get(w.pid, {}).get(
        "bytes", 0) >= mib * MIB)
    return w


def group(st, name):
    return next(g for g in st["groups"] if g["name"] == name)


def test_steady_growth_and_time_to_limit():
    cfg = config("[limits]\nfleet = 400MiB\nhigh_watermark = 99\n"
                 "growth_window = 3s\n")
    with Server("--config", cfg, "--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening", lambda: metrics_url(s))
        w = ramp_worker(s, 16, "ramp")
        watch = Watcher(s)
        try:
            watch.wait("subscribed", lambda e: e["scope"] == "fleet")
            flat = s.status()["fleet"]
            check(abs(flat["growth_bytes_per_s"]) <= MIB and
                  flat["seconds_to_limit"] is None, f"idle: {flat}")
            # 16 MiB + 40 MiB/s crosses 400 MiB after 9.6 s.
            w.send("ramp 40 11")
            t0 = time.monotonic()
            wait_for("a window and a bit", lambda:
                     time.monotonic() - t0 >= 4.5, timeout=30)
            st = s.status()
            at = time.time()
            f = st["fleet"]
            rate, eta = f["growth_bytes_per_s"], f["seconds_to_limit"]
            print(f"  fleet at {f['bytes'] / MIB:.0f} MiB: "
                  f"{rate / MIB:.2f} MiB/s, limit in {eta} s")
            # Within 1% on a quiet machine (0.3% typical); a shared one
            # has read it 1.6% low with a Watch subscriber competing, and
            # a worker starved of CPU ramps unevenly. A wrong rate (a
            # window or a unit mistaken) is off by far more than 5%.
            check(abs(rate - 40 * MIB) <= 0.05 * 40 * MIB,
                  f"fleet rate {rate / MIB:.2f} MiB/s, want 40 +/- 5%")
            g = group(st, "ramp")
            check(abs(g["growth_bytes_per_s"] - 40 * MIB) <= 0.05 * 40 * MIB
                  and
                  g["seconds_to_limit"] is None,
                  f"group (no limit): {g}")
            p = s.ps()[w.pid]
            check(abs(p["growth_bytes_per_s"] - 40 * MIB) <= 0.25 * 40 * MIB
                  and p["seconds_to_limit"] is None, f"process: {p}")
            _, _, body = get(url)
            m = parse(body)
            check(value(m, "memtally_fleet_growth_bytes_per_second") >
                  30 * MIB and
                  value(m, "memtally_fleet_seconds_to_limit") > 0 and
                  value(m, "memtally_group_growth_bytes_per_second",
                        group="ramp") > 30 * MIB, "metrics lack the rates")
            promtool(body)
            check(eta is not None, "no forecast while growing to a limit")
            over = watch.wait("fleet over", lambda e: e["scope"] == "fleet"
                              and e["state"] == "over", timeout=30)
            actual = over["time_ns"] / 1e9 - at
            print(f"  forecast {eta:.2f} s, crossed after {actual:.2f} s")
            check(abs(eta - actual) <= 0.15 * actual,
                  f"seconds_to_limit {eta:.2f}, crossed after "
                  f"{actual:.2f} s")
            check(w.readline().startswith("ramped"), "ramp not finished")
            f = s.status()["fleet"]
            check(f["seconds_to_limit"] is None, f"over: no forecast {f}")
        finally:
            watch.close()
            w.close()


def test_flat_and_shrinking():
    cfg = config("[limits]\nfleet = 2GiB\ngrowth_window = 3s\n"
                 "[group flat]\nlimit = 256MiB\n"
                 "[group shrink]\nlimit = 512MiB\n")
    with Server("--config", cfg) as s:
        flat = ramp_worker(s, 64, "flat")
        shrink = ramp_worker(s, 300, "shrink")
        try:
            shrink.send("ramp -20 8")
            t0 = time.monotonic()
            wait_for("a window and a bit", lambda:
                     time.monotonic() - t0 >= 4.5, timeout=30)
            st = s.status()
            ps = s.ps()
            gf, gs = group(st, "flat"), group(st, "shrink")
            print(f"  flat {gf['growth_bytes_per_s'] / MIB:+.3f} MiB/s, "
                  f"shrinking {gs['growth_bytes_per_s'] / MIB:+.2f} MiB/s")
            check(abs(gf["growth_bytes_per_s"]) <= MIB and
                  gf["seconds_to_limit"] is None, f"flat group: {gf}")
            check(abs(gs["growth_bytes_per_s"] + 20 * MIB) <= 2 * MIB and
                  gs["seconds_to_limit"] is None, f"shrinking group: {gs}")
            f = st["fleet"]
            check(f["growth_bytes_per_s"] < -10 * MIB and
                  f["seconds_to_limit"] is None, f"fleet: {f}")
            pf, pk = ps[flat.pid], ps[shrink.pid]
            check(abs(pf["growth_bytes_per_s"]) <= MIB and
                  pf["seconds_to_limit"] is None, f"flat process: {pf}")
            check(pk["growth_bytes_per_s"] < -10 * MIB and
                  pk["seconds_to_limit"] is None, f"shrinking process: {pk}")
        finally:
            flat.close()
            shrink.close()


def test_step_then_still_is_no_forecast():
    # 3 x 200 MiB under 1 GiB: 59%, far below the watermark, so only a
    # forecast could make the fleet or the group `high`; any rate above
    # ~7 MiB/s would be a forecast within the 60 s horizon.
    cfg = config("[limits]\nfleet = 1GiB\nhigh_watermark = 90\n"
                 "growth_window = 4s\nforecast_horizon = 60s\n"
                 "[group held]\nlimit = 1GiB\n")
    with Server("--config", cfg) as s:
        ws = []
        try:
            for _ in range(3):
                ws.append(Worker([*worker("hold"), "1"],
                                 s.env(group="held", **HEAP_ONLY)))
                check(ws[-1].readline().startswith("ready"), "not ready")
            wait_for("workers counted", lambda: len(s.ps()) == 3 and
                     s.status()["fleet"]["bytes"] >= 3 * MIB)
            watch = Watcher(s)
            watch.wait("subscribed", lambda e: e["scope"] == "fleet")
            # All three allocate at once (each 200 MiB, touched), then
            # hold still.
            for w in ws:
                w.send("more 200")
            for w in ws:
                check(w.readline().startswith("ready"), "more not held")
            t0 = time.monotonic()
            seen, polls = 0, 0
            # Two growth windows: the step crosses the whole window.
            while time.monotonic() - t0 < 8.5:
                st = s.status()
                f, g = st["fleet"], group(st, "held")
                seen = max(seen, f["bytes"])
                polls += 1
                check(f["seconds_to_limit"] is None and
                      f["growth_bytes_per_s"] == 0,
                      f"a step forecast for the fleet: {f}")
                check(g["seconds_to_limit"] is None and
                      g["growth_bytes_per_s"] == 0,
                      f"a step forecast for the group: {g}")
                check(f["state"] == "ok" and g["state"] == "ok",
                      f"high by forecast: {f} {g}")
                time.sleep(0.05)
            check(seen >= 603 * MIB, f"the step was not seen: {seen}")
            watch.drain()
            moved = [e for e in watch.events if e["state"] != e["previous"]]
            check(not moved, f"states changed: {moved}")
            print(f"  {polls} polls over 2 windows after "
                  f"{seen / MIB:.0f} MiB at once: no rate, no forecast")
        finally:
            for w in ws:
                w.close()
            if "watch" in locals():
                watch.close()


def test_forecast_horizon_turns_high_once():
    # Watermark at 360 MiB; the forecast is to make it `high` well before.
    cfg = config("[limits]\nhigh_watermark = 90\n"
                 "growth_window = 4s\nforecast_horizon = 10s\n")
    with Server("--config", cfg) as s:
        w = ramp_worker(s, 200, "noisy")
        # Its start (200 MiB in well under a second) is growth too: the
        # limit comes once that has left the 4 s window.
        t0 = time.monotonic()
        wait_for("start out of the window", lambda:
                 time.monotonic() - t0 > 4.2 and
                 s.status()["fleet"]["growth_bytes_per_s"] == 0,
                 timeout=30)
        s.cli("limit", "set", "fleet", "400MiB")
        watch = Watcher(s)
        try:
            watch.wait("subscribed", lambda e: e["scope"] == "fleet")
            check(s.status()["forecast_horizon_s"] == 10, "horizon")
            # 20 s of +/- 8 MiB every 100 ms around 200 MiB: no forecast
            # near 10 s, so no event.
            w.send("noise 8 20")
            check(w.readline(timeout=60) == "noised", "noise not done")
            watch.drain()
            moved = [e for e in watch.events if e["scope"] == "fleet" and
                     e["state"] != e["previous"]]
            check(not moved, f"a flat noisy figure changed state: {moved}")
            check(s.status()["fleet"]["state"] == "ok", "not ok")
            # 25 MiB/s from 200 MiB: ~8 s to the limit while still at
            # 70-75% of it, well below the 90% watermark.
            w.send("ramp 25 4")
            ev = watch.wait("fleet high by forecast", lambda e:
                            e["scope"] == "fleet" and e["state"] == "high",
                            timeout=30)
            print(f"  high at {ev['bytes'] / MIB:.0f} MiB: {ev['reason']}")
            check(ev["reason"].startswith("forecast: limit in"),
                  f"reason {ev['reason']!r}")
            check(ev["bytes"] < 360 * MIB, f"not below the watermark: {ev}")
            check(ev["seconds_to_limit"] is not None and
                  ev["seconds_to_limit"] <= 10, f"{ev}")
            check(w.readline().startswith("ramped"), "ramp not finished")
            # However the rate wobbles over the ramp: one change.
            watch.drain()
            moved = [(e["previous"], e["state"]) for e in watch.events
                     if e["scope"] == "fleet" and
                     e["state"] != e["previous"]]
            check(moved == [("ok", "high")], f"fleet changes: {moved}")
        finally:
            watch.close()
            w.close()


if __name__ == "__main__":
    run([test_steady_growth_and_time_to_limit, test_flat_and_shrinking,
         test_step_then_still_is_no_forecast,
         test_forecast_horizon_turns_high_once])
