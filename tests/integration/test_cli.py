"""The ``agent-runtime`` client commands, run as subprocesses against a real server."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.backend import open_backend
from runtime.store.audit import AuditEntry
from server.client import ApiError, Client
from tests.integration.server_proc import ROOT, ServerProcess

QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
DEMO = (QUESTION, "--scope", "sales_region:east")
CLI = (sys.executable, "-m", "server.cli")


def cli_env(server: ServerProcess) -> dict[str, str]:
    # No token given: the CLI takes the local keys the server created on first start.
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONIOENCODING": "utf-8",
        "AGENT_RUNTIME_URL": server.base_url,
        "AGENT_RUNTIME_DATA_DIR": str(server.data_dir),
        "AGENT_RUNTIME_DATABASE_URL": server.env["AGENT_RUNTIME_DATABASE_URL"],
    }


def start(server: ServerProcess) -> None:
    """Start the server as `make run` does: with no key in the store, it makes local ones."""
    server.env["AGENT_RUNTIME_BOOTSTRAP_LOCAL_KEYS"] = "true"
    server.start()


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env=cli_env(server),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def audit_of(server: ServerProcess, tenant: str) -> list[AuditEntry]:
    backend = await open_backend(server.env["AGENT_RUNTIME_DATABASE_URL"])
    try:
        entries, _ = await backend.store.page_audit(tenant, limit=100, cursor=None)
    finally:
        await backend.close()
    return entries


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def approval_hint(stdout: str) -> tuple[str, str]:
    found = re.search(r"approve (run-\S+) (ap-\S+) --follow", stdout)
    assert found, stdout
    return found[1], found[2]


def test_follow_park_approve_and_audit(server: ServerProcess) -> None:
    start(server)
    parked = cli(server, "run", *DEMO, "--follow")
    assert parked.returncode == 3, parked.stderr
    run_id, approval_id = approval_hint(parked.stdout)
    lines = parked.stdout.splitlines()
    assert lines[0] == f"created {run_id} (agent retail_analyst)"
    assert re.match(r"\[  4\] executing +▶ query_sales tc-[0-9a-f]{6} \{", lines[4]), lines[4]
    assert f"approval {approval_id} needed: publish_report" in parked.stdout
    assert "waiting_human ● executing → waiting_human" in parked.stdout
    assert "for:     a user with the approver role in local, not admin" in parked.stdout
    assert "→ handoff start retail_analyst → report_writer (depth 1): Write the report" in (
        parked.stdout
    )

    keys = json.loads((server.data_dir / "local-keys.json").read_text())
    as_admin = cli(server, "approve", run_id, approval_id, "--token", keys["admin"]["token"])
    assert as_admin.returncode == 2 and "ROLE_REQUIRED" in as_admin.stderr
    forged = cli(server, "approve", run_id, approval_id, "--by", "u-mgr")
    assert forged.returncode == 2 and "PRINCIPAL_MISMATCH" in forged.stderr
    approved = cli(server, "approve", run_id, approval_id, "--by", "approver", "--follow")
    assert approved.returncode == 0, approved.stderr
    out = approved.stdout
    assert f"approved {approval_id} (publish_report@1) by approver" in out
    seqs = [int(s) for s in re.findall(r"^\[ *(\d+)\]", out, re.M)]
    parked_seqs = [int(s) for s in re.findall(r"^\[ *(\d+)\]", parked.stdout, re.M)]
    # Resumes right after what --follow showed up to the park, missing and repeating nothing.
    first = parked_seqs[-1] + 1
    assert seqs == list(range(first, first + len(seqs))), out
    assert "▶ publish_report" in out and f"{run_id} succeeded" in out and "SKU-1008" in out
    assert "→ handoff return report_writer → retail_analyst (depth 1)" in out

    again = cli(server, "approve", run_id, approval_id)
    assert again.returncode == 0 and "already approved" in again.stdout
    conflict = cli(server, "reject", run_id, approval_id)
    assert conflict.returncode == 2 and "APPROVAL_CONFLICT" in conflict.stderr

    shown = cli(server, "show", run_id)
    assert shown.returncode == 0 and "state:    succeeded" in shown.stdout
    assert "answer: " in shown.stdout and "SKU-1008" in shown.stdout
    trace = cli(server, "trace", run_id, "--json")
    assert trace.returncode == 0, trace.stderr
    record = json.loads(trace.stdout)
    assert [e["seq"] for e in record["events"]] == list(range(1, len(record["events"]) + 1))
    assert [a["status"] for a in record["approvals"]] == ["approved"]
    assert [c["tool"] for c in record["tool_calls"]][-1] == "publish_report"
    text_trace = cli(server, "trace", run_id)
    assert text_trace.returncode == 0
    for section in ("steps:", "tool calls:", "approvals:", "events:"):
        assert f"\n{section}\n" in text_trace.stdout
    assert re.search(r"#1 \[retail_analyst\] handoff: .* → report_writer", text_trace.stdout)
    assert "#3 [report_writer] tool_calls: publish report" in text_trace.stdout

    listed = cli(server, "runs", "--json")
    assert listed.returncode == 0
    assert [r["run_id"] for r in json.loads(listed.stdout)["items"]] == [run_id]


def test_approve_without_follow_reports_the_runs_outcome(server: ServerProcess) -> None:
    """Not "executing", exit 4, a moment before the run succeeds (a probe: 3 of 3 times)."""
    start(server)
    run_id, approval_id = approval_hint(cli(server, "run", *DEMO, "--follow").stdout)

    # (--wait: its bound, and a loaded machine's demo may take more than the default 10 s.)
    approved = cli(
        server, "--json", "approve", run_id, approval_id, "--by", "approver", "--wait", "60"
    )

    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert json.loads(approved.stdout)["status"] == "approved"
    shown = cli(server, "show", run_id)
    assert "state:    succeeded" in shown.stdout


TERMINAL_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")
"""What the CLI must never print of a run's data: what a terminal acts on."""


def test_control_characters_in_a_runs_data_are_shown_escaped_not_sent_to_the_terminal(
    server: ServerProcess,
) -> None:
    """Anyone in a tenant may read its runs: an input or a comment with escape sequences
    must not clear, retitle or recolour another user's terminal, nor forge a line."""
    start(server)
    hostile = "\x1b[2J\x1b]0;pwned\x07\u202e\x9b31m\rFAKE"
    parked = cli(server, "run", QUESTION + hostile, "--scope", "sales_region:east", "--follow")
    run_id, approval_id = approval_hint(parked.stdout)
    comment = "line1\nstate:    succeeded\x1b[31m"
    rejected = cli(server, "reject", run_id, approval_id, "--comment", comment)
    shown = cli(server, "show", run_id)
    listed = cli(server, "runs")
    followed = cli(server, "follow", run_id)
    as_json = cli(server, "show", run_id, "--json")

    for done in (parked, rejected, shown, listed, followed, as_json):
        assert not TERMINAL_CONTROL.search(done.stdout + done.stderr), done
    assert rejected.returncode == 1 and len(rejected.stdout.splitlines()) >= 2
    assert "\\u001b[2J" in shown.stdout and "\\u001b[31m" in followed.stdout
    [state] = [line for line in shown.stdout.splitlines() if line.startswith("state:")]
    assert state.startswith("state:    failed ")  # the comment's "state:" is not a line
    assert json.loads(as_json.stdout)["input"] == QUESTION + hostile  # the same JSON


def test_output_that_cannot_be_written_is_a_usage_error_in_one_line(
    server: ServerProcess,
) -> None:
    """Not a traceback and exit 1 ("the run failed"), nor exit 0 with the output gone."""
    start(server)
    run_id = re.findall(r"^created (run-\S+)$", cli(server, "run", *DEMO).stdout, re.M)[0]
    for args in (("runs",), ("trace", run_id, "--json"), ("follow", run_id)):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [*CLI, *args],
                cwd=ROOT,
                env=cli_env(server),
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("agent-runtime: the output could not be written"), done
        assert "Traceback" not in done.stderr
    closed = subprocess.run(
        [*CLI, "runs"],
        cwd=ROOT,
        env=cli_env(server),
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert closed.returncode == 2 and "stdout is closed" in closed.stderr, closed


def test_json_follow_reject_cancel_and_errors(server: ServerProcess) -> None:
    start(server)
    followed = cli(server, "run", *DEMO, "--json", "--follow")
    assert followed.returncode == 3, followed.stderr
    events = json_lines(followed.stdout)  # one JSON object per line, nothing else
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "state" and events[-1]["data"]["to"] == "waiting_human"
    assert events[-2]["type"] == "approval_request"
    rejected_run, approval_id = events[-1]["run_id"], events[-2]["data"]["approval_id"]
    rejected = cli(server, "reject", rejected_run, approval_id, "--comment", "no")
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert "APPROVAL_REJECTED" in rejected.stdout

    created = cli(server, "run", *DEMO, "--idempotency-key", "k-1", "--max-steps", "9")
    assert created.returncode == 0, created.stderr
    run_id = re.findall(r"^created (run-\S+)$", created.stdout, re.M)[0]
    again = cli(server, "run", *DEMO, "--idempotency-key", "k-1", "--max-steps", "9", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["run_id"] == run_id
    parked = cli(server, "follow", run_id)
    assert parked.returncode == 3 and approval_hint(parked.stdout)[0] == run_id
    # Past its last event: nothing to show, and still parked (it used to follow for ever).
    quiet = cli(server, "follow", run_id, "--after", "100000", "--json")
    assert quiet.returncode == 3 and quiet.stdout == "", quiet.stderr
    # An id is one path segment: never another resource of the run, nor another run.
    for wrong in (f"{run_id}/checkpoint", f"x/../{run_id}", ".."):
        refused = cli(server, "cancel", wrong)
        assert refused.returncode == 2 and "VALIDATION_ERROR" in refused.stderr, refused
    assert json.loads(cli(server, "show", run_id, "--json").stdout)["state"] == "waiting_human"
    states = ("--state", "waiting_human", "--state", "failed") * 4  # the API takes 6 at most
    both = cli(server, "runs", "--json", *states)
    both_states = {r["run_id"]: r["state"] for r in json.loads(both.stdout)["items"]}
    assert both_states == {rejected_run: "failed", run_id: "waiting_human"}  # not the last alone
    nan = cli(server, "approve", run_id, "ap-x", "--wait", "nan")
    assert nan.returncode == 2 and "--wait" in nan.stderr
    word = cli(server, "runs", "--limit", "abc")
    assert word.returncode == 2 and "--limit: not a whole number: 'abc'" in word.stderr
    cancelled = cli(server, "cancel", run_id, "--reason", "not needed")
    assert cancelled.returncode == 1, cancelled.stderr
    assert "RUN_CANCELLED: not needed" in cancelled.stdout
    assert cli(server, "show", run_id).returncode == 1

    listed = json.loads(cli(server, "runs", "--json", "--state", "failed").stdout)["items"]
    assert {r["run_id"] for r in listed} == {rejected_run, run_id}
    # On a stream that is not UTF-8, the same JSON: escaped, not "?" for each character.
    ascii_out = subprocess.run(
        [*CLI, "show", run_id, "--json"],
        cwd=ROOT,
        env={**cli_env(server), "PYTHONIOENCODING": "ascii"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ascii_out.stdout.isascii() and json.loads(ascii_out.stdout)["input"] == QUESTION
    table = cli(server, "runs", "--limit", "1").stdout.splitlines()
    assert table[0].split() == ["RUN", "STATE", "AGENT", "STEPS", "CREATED", "INPUT"]
    assert len(table) == 2 and table[1].startswith(run_id)

    missing = cli(server, "show", "run-nope")
    assert missing.returncode == 2 and missing.stdout == ""
    assert "RUN_NOT_FOUND" in missing.stderr and "run-nope" in missing.stderr
    problem = cli(server, "trace", "run-nope", "--json")
    assert problem.returncode == 2 and json.loads(problem.stderr)["code"] == "RUN_NOT_FOUND"
    bad = cli(server, "run", "x", "--context-json", "[1]")
    assert bad.returncode == 2 and "JSON object" in bad.stderr
    down = cli(server, "--url", "http://127.0.0.1:9", "runs")
    assert down.returncode == 2 and "SERVER_UNREACHABLE" in down.stderr


def test_follow_reconnects_across_a_server_restart(server: ServerProcess) -> None:
    start(server)
    proc = subprocess.Popen(
        [*CLI, "run", "sleep 30", "--agent=slow_worker", "--follow", "--json"],
        cwd=ROOT,
        env=cli_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        head = []
        for line in proc.stdout:
            head.append(json.loads(line))
            if head[-1]["type"] == "action" and head[-1]["data"]["tool"] == "sleep":
                break
        server.kill()  # the stream drops mid-run
        server.env["TEST_SLEEP_OVERRIDE"] = "0.1"  # the resumed sleep is short
        server.start()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    events = head + json_lines(out)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # no gap, no repeat
    assert events[-1]["data"]["to"] == "succeeded"
    assert "reconnecting after event" in err


def test_a_follow_whose_stream_is_refused_for_now_waits_for_a_slot(
    server: ServerProcess,
) -> None:
    """429 TOO_MANY_STREAMS after the run is created: the follow waits the answer's
    Retry-After and goes on. It exited 2 with the run created, and a script retrying on
    that exit code created a second run."""
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    start(server)
    made = cli(server, "keys", "create", "--tenant", "t", "--user", "u", "--json")
    token = json.loads(made.stdout)["token"]
    as_key = {"Authorization": f"Bearer {token}"}
    with server.client(as_key) as http:
        parked = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 30"})
        url = f"{server.base_url}/runs/{parked.json()['run_id']}/events"
        with httpx.stream("GET", url, headers=as_key, timeout=30) as held:
            assert held.status_code == 200  # the caller's one slot
            proc = subprocess.Popen(
                [*CLI, "--token", token, "run", "x", "--agent=typo_fixer", "--follow", "--json"],
                cwd=ROOT,
                env=cli_env(server),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert proc.stderr is not None and proc.stdout is not None
            err: list[str] = []
            reading = threading.Thread(target=lambda: err.extend(proc.stderr or ()))
            reading.start()
            try:
                for _ in range(600):  # until the CLI has been refused its stream
                    if any("TOO_MANY_STREAMS" in line for line in err) or proc.poll() is not None:
                        break
                    time.sleep(0.05)
            except BaseException:
                proc.kill()
                raise
        try:
            proc.wait(timeout=60)
            out = proc.stdout.read()
        finally:
            proc.kill()
            reading.join()
        http.post(f"/runs/{parked.json()['run_id']}/cancel")
    assert proc.returncode == 0, err
    assert any("TOO_MANY_STREAMS" in line for line in err), err
    events = json_lines(out)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["data"]["to"] == "succeeded"
    listed = json.loads(cli(server, "--token", token, "runs", "--json").stdout)
    assert len(listed["items"]) == 2, listed  # the parked one, and the CLI's one


def test_a_follow_refused_a_stream_for_good_says_so_not_unreachable(
    server: ServerProcess,
) -> None:
    """A follow that gives up on 429s says the server's answer (it said "server
    unreachable", sending its reader after the network)."""
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    start(server)
    token = json.loads(
        cli(server, "keys", "create", "--tenant", "t", "--user", "u", "--json").stdout
    )["token"]
    as_key = {"Authorization": f"Bearer {token}"}
    with server.client(as_key) as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 30"}).json()[
            "run_id"
        ]
        url = f"{server.base_url}/runs/{run_id}/events"
        with (
            httpx.stream("GET", url, headers=as_key, timeout=30) as held,
            Client(server.base_url, token=token) as client,
        ):
            assert held.status_code == 200  # the caller's one slot
            with pytest.raises(ApiError) as refused:
                next(client.events(run_id, reconnect_window_s=1.0))
        http.post(f"/runs/{run_id}/cancel")
    assert refused.value.status == 429 and refused.value.code == "TOO_MANY_STREAMS"
    assert "still so after 1 s" in refused.value.detail


class NotOurs(http.server.BaseHTTPRequestHandler):
    """Another HTTP server at --url: an HTML page under /html, elsewhere a JSON object
    that is none of ours."""

    def do_GET(self) -> None:
        html = self.path.startswith("/html")
        body = b"<!DOCTYPE HTML>\n<html>\n<p>Nope</p>\n</html>\n" if html else b'{"hello": 1}'
        self.send_response(404 if html else 200)
        self.send_header("Content-Type", "text/html" if html else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


def test_input_from_stdin_is_utf8_text(server: ServerProcess) -> None:
    """A file saved with a BOM sends its text; bytes that are not UTF-8 are refused as
    that, not as "an argument or the token cannot be sent" (they came through as
    surrogates), and make no run."""
    start(server)

    def run_from_stdin(data: bytes) -> subprocess.CompletedProcess[bytes]:
        command = [*CLI, "run", "-", "--scope", "sales_region:east", "--json"]
        env = cli_env(server)
        return subprocess.run(command, cwd=ROOT, env=env, input=data, capture_output=True)

    sent = run_from_stdin(b"\xef\xbb\xbf" + QUESTION.encode() + b"\n")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["input"] == QUESTION
    before = json.loads(cli(server, "runs", "--json").stdout)["items"]

    refused = run_from_stdin(b"sales \xff\xfe east")
    assert refused.returncode == 2 and not refused.stdout, refused
    assert refused.stderr.decode().count("\n") == 1, refused.stderr
    assert b"the input on stdin is not UTF-8 text" in refused.stderr
    assert json.loads(cli(server, "runs", "--json").stdout)["items"] == before


def test_what_the_cli_would_have_got_wrong_it_refuses(server: ServerProcess) -> None:
    start(server)
    before = json.loads(cli(server, "runs", "--json").stdout)["items"]
    # A scope of --context-json that is not a list: the server's 422, not its characters.
    spread = cli(
        server, "run", "x", "--context-json", '{"scope": "sales_region:east"}', "--scope", "a"
    )
    assert spread.returncode == 2 and "VALIDATION_ERROR" in spread.stderr, spread
    assert json.loads(cli(server, "runs", "--json").stdout)["items"] == before
    # An empty --token (a script's unset $TOKEN) is refused, not the local admin's key.
    empty = cli(server, "runs", "--token", "")
    assert empty.returncode == 2 and "--token is empty" in empty.stderr and not empty.stdout

    # Input over several lines is shown on one: no line of it passes for a field.
    created = cli(server, "run", "first line\nstate:    succeeded", "--scope", "sales_region:east")
    run_id = re.findall(r"^created (run-\S+)$", created.stdout, re.M)[0]
    shown = cli(server, "show", run_id).stdout.splitlines()
    assert [line for line in shown if line.startswith("state:")] == [shown[2]], shown
    cli(server, "cancel", run_id)

    # Output whose reader went away: 141, whatever the run's state (it was 0 or 1).
    proc = subprocess.Popen(
        [*CLI, "show", run_id], cwd=ROOT, env=cli_env(server), stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    # The same when it is the errors' reader that went away, as an error was said.
    proc = subprocess.Popen(
        [*CLI, "show", "run-nope"],
        cwd=ROOT,
        env=cli_env(server),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141

    # --url reaching another server: one line, and a bad response rather than a traceback.
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotOurs)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{other.server_address[1]}"
        page = cli(server, "--url", f"{url}/html", "runs")
        assert page.returncode == 2 and page.stderr.strip() == (
            "agent-runtime: error HTTP_404 (HTTP 404): <!DOCTYPE HTML>"
        ), page.stderr
        for command in (
            ("show", "run-x"),
            ("trace", "run-x"),
            ("cancel", "run-x"),
            ("runs",),
            ("approve", "run-x", "ap-x"),
        ):
            not_ours = cli(server, "--url", url, *command)
            assert not_ours.returncode == 2 and not not_ours.stdout, (command, not_ours)
            assert "BAD_RESPONSE" in not_ours.stderr and "Traceback" not in not_ours.stderr
    finally:
        other.shutdown()


def test_keys_create_list_revoke(server: ServerProcess) -> None:
    start(server)
    assert cli(server, "run", "x", "--agent", "typo_fixer").returncode == 0
    created = cli(server, "keys", "create", "--tenant", "acme", "--user", "bob", "--json")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    assert key["token"].startswith("ark_")
    stored = (server.data_dir / "local-keys.json").read_text()
    assert key["token"] not in stored

    # Bob of acme sees none of the local tenant's runs, and his runs are his tenant's.
    bob = cli(server, "runs", "--json", "--token", key["token"])
    assert bob.returncode == 0 and json.loads(bob.stdout)["items"] == []
    mine = cli(server, "run", "x", "--agent", "typo_fixer", "--json", "--token", key["token"])
    assert json.loads(mine.stdout)["context"] == {
        "user_id": "bob",
        "tenant_id": "acme",
        "scope": [],
    }
    listed = cli(server, "keys", "list", "--tenant", "acme")
    assert listed.returncode == 0
    assert listed.stdout.split()[:3] == [key["key_id"], "acme/bob", "active"]
    assert key["token"] not in listed.stdout
    for asked in (("keys", "list", "--tenant", "acme", "--json"), ("--json", "keys", "list")):
        as_json = json.loads(cli(server, *asked).stdout)
        mine_listed = [k for k in as_json if k["key_id"] == key["key_id"]]
        assert [(k["tenant_id"], k["user_id"], k["revoked_at"]) for k in mine_listed] == [
            ("acme", "bob", None)
        ], as_json
        assert all("hash" not in name for k in as_json for name in k)

    revoked = cli(server, "keys", "revoke", key["key_id"])
    assert revoked.returncode == 0 and revoked.stdout == ""
    assert f"key {key['key_id']} of bob of acme revoked" in revoked.stderr
    refused = cli(server, "runs", "--token", key["token"])
    assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr
    assert cli(server, "keys", "revoke", key["key_id"]).returncode == 2
    bad_role = cli(server, "keys", "create", "--tenant", "a", "--user", "b", "--role", "root")
    assert bad_role.returncode == 2
    # Both changes are on acme's audit trail; the refused second revoke is not.
    trail = asyncio.run(audit_of(server, "acme"))
    assert [(e.action, e.subject, e.actor) for e in trail] == [
        ("key.create", key["key_id"], "cli"),
        ("key.revoke", key["key_id"], "cli"),
    ]
    assert trail[0].detail == {"user_id": "bob", "roles": [], "scopes": []}


def test_a_revoked_key_ends_the_streams_it_opened(server: ServerProcess) -> None:
    """A parked run's stream may stay open for days: revoking the key that opened it
    ends it within a keepalive, and its reconnect is refused."""
    server.env["AGENT_RUNTIME_SSE_KEEPALIVE_S"] = "0.2"
    server.start()
    made = cli(
        server, "keys", "create", "--tenant", "demo-retail", "--user", "u-ops-001",
        "--scope", "sales_region:east", "--json",
    )  # fmt: skip
    key = json.loads(made.stdout)
    as_key = {"Authorization": f"Bearer {key['token']}"}
    with server.client(as_key) as http:
        run_id = http.post("/runs", json={"input": QUESTION}).json()["run_id"]
    url = f"{server.base_url}/runs/{run_id}/events"
    seen: list[dict[str, Any]] = []
    revoked_at = None
    with httpx.stream("GET", url, headers=as_key, timeout=30) as resp:
        for line in resp.iter_lines():  # keepalives every 0.2 s: the loop checks the clock
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if seen[-1]["type"] == "state" and seen[-1]["data"]["to"] == "waiting_human":
                    assert cli(server, "keys", "revoke", key["key_id"]).returncode == 0
                    revoked_at = time.monotonic()
            if revoked_at is not None and time.monotonic() - revoked_at > 10:
                pytest.fail("the stream went on after its key was revoked")
    assert revoked_at is not None, seen  # the stream ended after the revocation, not before
    assert seen[-1]["data"]["to"] == "waiting_human"
    assert httpx.get(url, headers=as_key).status_code == 401
    with server.client() as http:  # the run itself goes on, for a caller still allowed
        assert http.get(f"/runs/{run_id}").json()["state"] == "waiting_human"


@pytest.mark.parametrize("setting", ["DATABASE_URL", "DATA_DIR"])
def test_a_read_of_a_database_that_is_not_there_is_refused_not_made(
    tmp_path: Path, setting: str
) -> None:
    """A mistyped path: opening it made an empty store, and "0 runs ended before …"
    (exit 0, even with --dry-run, "nothing deleted") or an empty key list vouched for
    the typo. (``keys create`` may make the database: a key before the first start.)"""
    typo = tmp_path / "typo"
    value = f"sqlite:///{typo}/runtme.db" if setting == "DATABASE_URL" else str(typo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_RUNTIME_")}
    env |= {"PYTHONPATH": str(ROOT), f"AGENT_RUNTIME_{setting}": value}

    for command in (
        ["prune", "--older-than", "30"],
        ["prune", "--older-than", "30", "--dry-run"],
        ["keys", "list"],
        ["keys", "revoke", "key-0"],
    ):
        done = subprocess.run(
            [*CLI, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        said = f"agent-runtime {command[0]}: AGENT_RUNTIME_{setting}: no database at {typo}"
        assert said in done.stderr, done.stderr
        assert not typo.exists()

    # An empty file, as a start refused after taking the file's lock leaves (a probe):
    # no database either, and left empty.
    typo.mkdir()
    empty = typo / ("runtme.db" if setting == "DATABASE_URL" else "runtime.db")
    empty.touch()
    done = subprocess.run(
        [*CLI, "keys", "list"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "no database at" in done.stderr, done.stderr
    assert empty.stat().st_size == 0


def test_prune_deletes_the_runs_that_ended_long_enough_ago(server: ServerProcess) -> None:
    start(server)
    created = cli(server, "run", "x", "--agent", "typo_fixer", "--json")
    run_id = json.loads(created.stdout)["run_id"]
    assert cli(server, "follow", run_id).returncode == 0  # it succeeded

    kept = cli(server, "prune", "--older-than", "1", "--json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["runs"] == 0
    assert json.loads(kept.stdout)["ended_before"].endswith("Z")
    counted = cli(server, "prune", "--older-than", "0", "--dry-run", "--json")
    assert json.loads(counted.stdout)["runs"] == 1
    assert cli(server, "show", run_id).returncode == 0  # a dry run deletes nothing

    gone = cli(server, "prune", "--older-than", "0")
    assert gone.returncode == 0 and gone.stdout.startswith("deleted 1 runs"), gone.stdout
    missing = cli(server, "show", run_id)
    assert missing.returncode == 2 and "RUN_NOT_FOUND" in missing.stderr
    for bad in ("-1", "soon"):
        assert cli(server, "prune", "--older-than", bad).returncode == 2
