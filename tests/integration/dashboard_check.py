"""Checks the dashboard as chromium rendered it (dashboard.sh) against
/v1/status, /metrics (read with Prometheus's own parser) and the database.

Arguments: live.html final.html status.json metrics.txt dashboard.json
refused.json coordinator.log compact.html VERSION STORED MERGED BYTES
ATTACK_PEER_ID (compact.html: the final page in a 1000 x 900 window)
"""
import collections
import json
import math
import re
import sys
from html.parser import HTMLParser

from prometheus_client.parser import text_string_to_metric_families


class Page(HTMLParser):
    """Every element with an id (its attributes and text), the peer table's
    rows and the refusal tables' rows, each with its cells' data-value."""

    def __init__(self, text):
        super().__init__()
        self.by_id, self.body = {}, {}
        self.peers, self.codes, self.recent = [], [], []
        self._open = []  # ids whose text is being collected
        self._row = None
        self._table = None
        self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if "id" in a:
            self.by_id[a["id"]] = {"attrs": a, "text": ""}
            if tag not in ("svg", "table", "pre"):
                self._open.append((tag, a["id"]))
            if tag == "table":
                self._table = a["id"]
            if tag == "pre":
                self._open.append((tag, a["id"]))
        if tag == "tr" and self._table:
            self._row = {"attrs": a, "cells": {}}
        if tag == "td" and self._row is not None and "data-field" in a:
            self._cell = a["data-field"]
            self._row["cells"][self._cell] = {"value": a.get("data-value", ""), "text": ""}

    def handle_endtag(self, tag):
        if self._open and self._open[-1][0] == tag:
            self._open.pop()
        if tag == "td":
            self._cell = None
        if tag == "tr" and self._row is not None:
            if self._row["cells"]:
                {"peers": self.peers, "refused-codes": self.codes,
                 "recent-refusals": self.recent}[self._table].append(self._row)
            self._row = None
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        for _, i in self._open:
            self.by_id[i]["text"] += data
        if self._cell is not None:
            self._row["cells"][self._cell]["text"] += data

    def value(self, i):
        return self.by_id[i]["attrs"]["data-value"]

    def attr(self, i, name):
        return self.by_id[i]["attrs"][name]


def main():
    (live_path, final_path, status_path, metrics_path, dash_path, refused_path, log_path,
     compact_path, version, stored, merged, total_bytes, atk) = sys.argv[1:14]
    version, stored, merged, total_bytes, atk = (int(version), int(stored), int(merged),
                                                 int(total_bytes), int(atk))
    live = Page(open(live_path).read())
    page = Page(open(final_path).read())
    status = json.load(open(status_path))
    dash = json.load(open(dash_path))
    fam = {f.name: f for f in text_string_to_metric_families(open(metrics_path).read())}

    def metric(name, suffix="", **labels):
        for s in fam[name].samples:
            if s.name in (name + suffix, name + "_total") and all(
                    s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise AssertionError(f"no sample {name}{suffix} {labels}")

    # While the peers trained, the page had loaded its figures.
    assert live.body.get("data-loaded") == "1", live.body
    assert live.value("run-status") == "running", live.value("run-status")
    assert 3 <= int(live.value("version")) < version, live.value("version")
    assert int(live.attr("chart-loss-version", "data-points")) >= 4
    assert len(live.peers) == 3, len(live.peers)
    assert any(r["attrs"]["data-state"] == "active" for r in live.peers)
    # The time to the end, at the pace of the versions so far: a number of
    # seconds, in keeping with the versions left.
    live_status = live.value("run-status")
    eta = int(live.value("eta"))
    left = int(live.value("max-versions")) - int(live.value("version"))
    assert eta >= 0 and live.by_id["eta"]["text"].startswith("ends in about "), (eta, live_status)
    assert eta <= 60 * left, (eta, left)

    assert page.body.get("data-loaded") == "1", page.body
    # Where the run is.
    assert int(page.value("version")) == version == status["version"] == metric("volley_version")
    assert page.value("run-status") == "finished" == status["status"]
    assert int(page.value("max-versions")) == status["max_versions"]
    loss = float(page.value("val-loss"))
    assert abs(loss - metric("volley_validation_loss")) < 1e-6, loss
    assert abs(loss - status["versions"][-1]["val_loss"]) < 1e-6, loss
    assert page.by_id["val-loss"]["text"] == f"{loss:.4f}", page.by_id["val-loss"]["text"]
    losses = [v for v in status["versions"] if v["val_loss"] is not None]
    assert int(page.attr("chart-loss-version", "data-points")) == len(losses) == version + 1
    # Uploads, accepted and refused by code.
    accepted = metric("volley_uploads", result="accepted", code="")
    assert int(page.value("uploads-accepted")) == accepted == stored, (accepted, stored)
    refused = {s.labels["code"]: s.value for s in fam["volley_uploads"].samples
               if s.labels.get("result") == "refused"}
    shown = {r["cells"]["code"]["value"]: int(r["cells"]["count"]["value"]) for r in page.codes}
    unsigned = json.load(open(refused_path))["error"]["code"]
    assert shown == refused and shown[unsigned] == 1 and shown["duplicate_update"] == 1, (
        shown, refused)
    assert int(page.value("uploads-refused")) == sum(refused.values())
    assert int(page.attr("chart-uploads", "data-total")) == stored
    # Peers by state, and each peer's row.
    ps = status["peer_states"]
    assert int(page.value("peers-total")) == status["peers"] == 3
    for s in ("active", "idle", "gone"):
        assert int(page.value("peers-" + s)) == ps[s] == metric("volley_peers", state=s), s
    assert int(page.value("peers-revoked")) == metric("volley_peers", state="revoked") == 0
    listed = {p["id"]: p for p in ps["list"]}
    # Each peer's refused uploads, as the coordinator's log has them (a
    # real peer may meet the run's norm bound too).
    log_refused = collections.Counter(
        int(m.group(2)) for m in re.finditer(r"POST /v1/updates (\d{3}) .* peer=(\d+)$",
                                             open(log_path).read(), re.M)
        if int(m.group(1)) >= 400)
    assert log_refused[atk] >= 1, log_refused
    rows = {int(r["attrs"]["data-peer-id"]): r for r in page.peers}
    assert rows.keys() == listed.keys(), (rows.keys(), listed.keys())
    for pid, r in rows.items():
        c = r["cells"]
        assert r["attrs"]["data-state"] == listed[pid]["state"], pid
        assert int(c["updates"]["value"]) == listed[pid]["updates"], pid
        assert int(c["last_seen"]["value"]) == listed[pid]["last_seen"], pid
        assert c["address"]["value"] == "127.0.0.1", (pid, c["address"])
        assert int(c["refused"]["value"]) == log_refused[pid], (pid, c["refused"], log_refused)
    assert sum(int(r["cells"]["merged"]["value"]) for r in page.peers) == merged
    assert sum(int(r["cells"]["bytes"]["value"]) for r in page.peers) == total_bytes
    names = sorted(r["cells"]["name"]["value"] for r in page.peers if int(
        r["attrs"]["data-peer-id"]) != atk)
    assert names == ["it-peer-1", "it-peer-2"], names
    assert any("cpus" in r["cells"]["hardware"]["value"] for r in page.peers)
    # The latest refusals: the registered peer's duplicate, with its id,
    # and the unsigned upload, with none.
    recent = [(r["cells"]["code"]["value"], r["cells"]["peer"]["value"],
               r["cells"]["status"]["value"]) for r in page.recent]
    assert ("duplicate_update", str(atk), "409") in recent, recent
    assert any(c == unsigned and p == "0" for c, p, _ in recent), recent
    # Compression: a dense update's bytes over the bytes an update took.
    last = [v for v in status["versions"] if v["bytes_per_update"]][-1]
    ratio = float(page.value("compression"))
    assert math.isclose(ratio, dash["dense_update_bytes"] / last["bytes_per_update"],
                        rel_tol=1e-9), ratio
    # The writer: the page's commits are /metrics's, and the two new
    # histograms add up to the counters beside them.
    commits = metric("volley_writer_commits")
    assert int(page.value("writer-commits")) == commits
    assert metric("volley_writer_commit_seconds", "_count") == commits
    assert metric("volley_writer_commit_seconds", "_bucket", le="+Inf") == commits
    assert metric("volley_writer_commit_seconds", "_sum") > 0
    assert metric("volley_writer_batch_size", "_sum") == metric("volley_writer_jobs")
    assert metric("volley_writer_batch_size", "_count") >= commits
    assert metric("volley_writer_batch_size", "_bucket", le="1") <= metric(
        "volley_writer_batch_size", "_count")
    # Finished: no time left, and said so.
    assert int(page.value("eta")) == 0 and page.by_id["eta"]["text"] == "finished"
    # A compressed run shows its compression chart.
    assert page.attr("fig-compression", "data-shown") == "1"
    # In a 1000 x 900 window, the peers' table and both refusal tables
    # end above the fold, with every row drawn.
    compact = Page(open(compact_path).read())
    assert len(compact.peers) == 3 and len(compact.recent) >= 2, (compact.peers, compact.recent)
    fold = {}
    for i in ("panel-peers", "panel-refused-codes", "panel-recent-refusals"):
        top, bottom = int(compact.attr(i, "data-top")), int(compact.attr(i, "data-bottom"))
        assert 0 < top < bottom <= 900, (i, top, bottom)
        fold[i] = bottom
    # The configuration, as the run has it.
    assert json.loads(page.by_id["config"]["text"])["name"] == status["run"]
    print(f"dashboard: version {version}, loss {loss:.4f}, {stored} uploads accepted, "
          f"refused {shown}, peers {sorted(rows)}, {merged} merged, {total_bytes} bytes, "
          f"compression {ratio:.1f}x, {commits:.0f} commits; at 1000 x 900 the panels end at "
          f"{fold} px; live estimate {eta} s for {left} versions")


main()
