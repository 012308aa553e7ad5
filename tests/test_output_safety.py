"""Output that cannot be forged: other users' text reaches a terminal or a page only as visible text.

`%gpu status` and `tfgpu` show command lines, user names, claim records and GPU names that
other users (or the OS) chose.  Control characters, escape sequences and bidi overrides in
them must show as visible escapes, never act on the terminal; a newline must not start a
forged line; bytes that are not UTF-8 must render, not raise.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tfgpu_magic.gpus import claims
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session
from tfgpu_magic.safe_text import safe, safe_tree

ROOT = Path(__file__).resolve().parent.parent
ME = 4242

# A command line that tries everything: clear the screen (CSI), set the window title and
# hyperlink (OSC), C1 CSI, DEL, a bell, a forged line after \n and \r, and a bidi override.
HOSTILE_COMMAND = (
    "python x.py\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\"
    "\x9b31m\x7f\x08\x00\nGPU 9  NVIDIA FAKE  0 MiB / 80.0 GiB used\rclean \u202egnp.exe\u2066\u2028"
)
HOSTILE_USER = "bob\x1b[8m\r\nroot"
HOSTILE_NAME = "NVIDIA A100\x1b[1A\x1b[2K"


@pytest.fixture(autouse=True)
def claim_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(claims.ENV_DIR, str(tmp_path / "claims"))
    yield
    claims.release_all()


def hostile_report() -> dict:
    server = shared_server(ME)
    bob = server.gpus[1].processes[2]
    bob.command, bob.user = HOSTILE_COMMAND, HOSTILE_USER
    server.gpus[0].processes[0].command = "python \udcff\udcfe.py"  # bytes that are not UTF-8
    server.gpus[2].name = HOSTILE_NAME
    report = status.build_report(Session(nvml=Nvml(lib=server), env={}), my_pid=ME)
    report["gpus"][2]["claim"] = {  # OSC 52 writes to the clipboard
        "pid": None,
        "user": "eve\x1b]52;c;cm0gLXJmIH4=\x07",
        "since": None,
        "this_kernel": False,
    }
    report["gpus"][2]["notes"].append("pid 666: left\nNote: forged \x1b[31mred")
    report["notes"].append("claims could not be read: \x1b[2J\r\n")
    return report


def controls_in(text: str) -> list[str]:
    """Characters a terminal would act on (everything but the newline between our own lines)."""
    return [
        ch
        for ch in text
        if ch != "\n"
        and (
            ord(ch) < 0x20
            or 0x7F <= ord(ch) < 0xA0
            or 0xD800 <= ord(ch) < 0xE000
            or ch in "\u2028\u2029\u061c\u200e\u200f"
            or 0x202A <= ord(ch) <= 0x202E
            or 0x2066 <= ord(ch) <= 0x2069
        )
    ]


# -- the one function ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("python train.py --lr 0.1", "python train.py --lr 0.1"),
        ("naïve ünïcode · 日本語 ✓", "naïve ünïcode · 日本語 ✓"),  # printable text stays as it is
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("\x9b31m\x85\x7f\x00", "\\x9b31m\\x85\\x7f\\x00"),
        ("abc\u202edef\u2066\u200f", "abc\\u202edef\\u2066\\u200f"),
        ("line\u2028sep\u2029", "line\\u2028sep\\u2029"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("python \udcff.py", "python \\xff.py"),  # a surrogate-escaped byte shows as that byte
        ("lone \ud800", "lone \\ud800"),
        ("no\u00a0break", "no\u00a0break"),  # a space, if an odd one
    ],
)
def test_safe_shows_controls_as_visible_escapes(raw, shown):
    assert safe(raw) == shown
    assert controls_in(safe(raw)) == []


def test_safe_tree_cleans_every_string_keys_included_and_leaves_the_rest():
    tree = {"a\x1b": ["x\ny", 3, None, {"k": ("\u202e", 1.5, True)}]}
    assert safe_tree(tree) == {"a\\x1b": ["x\\ny", 3, None, {"k": ("\\u202e", 1.5, True)}]}
    assert tree == {"a\x1b": ["x\ny", 3, None, {"k": ("\u202e", 1.5, True)}]}  # a copy: the report stays raw


# -- the terminal table -------------------------------------------------------------------------
def test_text_neutralises_hostile_commands_users_claims_names_and_notes():
    text = status.render_text(hostile_report())
    assert controls_in(text) == []
    lines = text.splitlines()
    assert not any(line.startswith(("GPU 9", "root", "Note: forged", "clean")) for line in lines)
    assert not any(line.lstrip().startswith(("GPU 9", "root", "Note: forged", "clean")) for line in lines)
    bob = next(line for line in lines if "pid 41003" in line)
    assert "bob\\x1b[8m\\r\\nroot" in bob and "python x.py\\x1b[2J\\x1b]0;pwned" in bob
    assert "GPU 2  NVIDIA A100\\x1b[1A\\x1b[2K  " in text
    assert "  claimed by another process (eve\\x1b]52;c;cm0gLXJmIH4=\\x07)" in text
    assert "  note: pid 666: left\\nNote: forged \\x1b[31mred" in text
    assert "Note: claims could not be read: \\x1b[2J\\r\\n" in text
    assert "python \\xff\\xfe.py" in text


def test_every_line_of_the_table_is_one_of_ours():
    """However long or hostile, each field stays on its own line: as many lines as with clean data."""
    clean = status.render_text(
        status.build_report(Session(nvml=Nvml(lib=shared_server(ME)), env={}), my_pid=ME)
    )
    hostile = status.render_text(hostile_report())
    assert len(hostile.splitlines()) == len(clean.splitlines()) + 3  # the claim and the two added notes


def test_text_with_bytes_that_are_not_utf8_prints_to_a_strict_utf8_terminal():
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    print(status.render_text(hostile_report()), file=out)
    out.flush()
    assert b"python \\xff\\xfe.py" in out.buffer.getvalue()


def test_a_long_hostile_command_is_cut_without_leaking_a_control():
    report = hostile_report()
    report["gpus"][1]["processes"][2]["command"] = "x" * 40 + "\x1b[2J" * 20
    line = next(line for line in status.render_text(report).splitlines() if "pid 41003" in line)
    assert controls_in(line) == [] and line.endswith("…")


# -- the notebook card --------------------------------------------------------------------------
class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


def test_html_escapes_hostile_commands_users_and_claims():
    report = hostile_report()
    proc = report["gpus"][1]["processes"][2]
    proc["command"] = 'python "><script>alert(1)</script><img src=x onerror=alert(2)>.py' + "\x1b[2J"
    proc["user"] = "bob' onmouseover='alert(3)"
    report["gpus"][2]["claim"]["user"] = '"><iframe src=//evil>'
    report["gpus"][1]["name"] = 'A100" title="x'
    page = status.render_html(report)
    elements = _Elements()
    elements.feed(page)
    assert set(elements.tags) <= {"div", "table", "tr", "th", "td", "span"}
    assert {name for name, _ in elements.attrs} <= {"class", "style", "title"}
    assert "<script" not in page and "<iframe" not in page and "<img" not in page
    assert "onerror=" not in "".join(v or "" for _, v in elements.attrs)
    text = "".join(elements.text)
    assert '"><script>alert(1)</script>' in text  # shown, as text
    assert "bob' onmouseover='alert(3)" in text and '"><iframe src=//evil>' in text
    assert controls_in(page) == [] and "\\x1b[2J" in text
    page.encode("utf-8")  # no lone surrogate left for the kernel's JSON to choke on


# -- the CLI in a real pipeline -----------------------------------------------------------------
def _pipeline(cli_args: list[str], reader: list[str]) -> tuple[subprocess.CompletedProcess, int, bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-m", "tfgpu_magic", *cli_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    head = subprocess.run(reader, stdin=writer.stdout, capture_output=True, timeout=60)
    writer.stdout.close()  # only head holds the read end now
    stderr = writer.stderr.read()
    writer.stderr.close()
    return head, writer.wait(timeout=60), stderr


@pytest.mark.parametrize(
    ("cli_args", "reader"),
    [
        (["--demo"], ["head", "-3"]),
        (["--demo"], ["head", "-n", "0"]),  # exits before reading: the write meets a closed pipe
        (["--demo", "--json"], ["head", "-n", "0"]),
        (["--help"], ["head", "-n", "0"]),
    ],
)
def test_a_reader_that_goes_away_ends_the_cli_quietly(cli_args, reader):
    head, code, stderr = _pipeline(cli_args, reader)
    assert stderr == b"", stderr.decode(errors="replace")
    assert code in (0, 141)  # 141: the shell's status of a tool ended by SIGPIPE; 0 if all fit in the pipe
    if reader == ["head", "-3"]:
        assert head.stdout.decode().splitlines()[0] == "Machine:    4 GPUs; user me"


def test_a_closed_pipe_gives_status_141():
    _head, code, stderr = _pipeline(["--demo"], ["head", "-n", "0"])
    assert (code, stderr) == (141, b"")


def test_a_terminal_that_cannot_encode_our_characters_still_gets_the_table():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run(
        [sys.executable, "-m", "tfgpu_magic", "--demo"],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode(errors="replace")
    assert b"my processes 14.0 GiB \\xb7 other users" in proc.stdout


def test_a_cut_never_splits_an_escape():
    """`bounded('evil\\u202egnp.exe', 10)` ended in a half escape, `evil\\u202…` (review)."""
    from tfgpu_magic.safe_text import bounded

    assert bounded("evil\u202egnp.exe", 10) == "evil…"
    assert bounded("evil\u202egnp.exe", 11) == "evil\\u202e…"
    assert len(bounded("x" * 5000, 1024)) == 1024
