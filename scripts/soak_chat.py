"""Soak `infer chat` in a pseudo-terminal: hundreds of turns typed as a person types them, and what the
process looks like afterwards.

One chat session (the embedded model unless MODEL is given, offline) driven with pexpect for --turns
turns, each drawn at random (--seed) from: ordinary questions, unicode and emoji, Ctrl-C in the middle
of a reply or of a long prompt's prefill (the reply stops, the chat stays), Ctrl-C on a half-typed line
and inside a multi-line \"\"\" message (the line is dropped, the chat stays), every slash command with
good and bad arguments (/save and /load through files), pastes near the context limit (the oldest
turns are dropped) and over it (a one-line error, the conversation kept), empty and blank lines.

Checked after every turn: the prompt comes back (the REPL is alive), no traceback ever appears, and the
conversation holds exactly the messages it should: the script counts them as it goes (+2 a reply, even
a stopped one; minus the oldest messages the chat says it dropped; 0 after /clear) and compares with
/show every few turns, so a turn lost or kept twice is caught. A /save is read back and checked. At the
end Ctrl-D must exit with code 0; before the session, Ctrl-C at an empty prompt must exit with code 0.

Measured: the child's RSS (VmRSS), open file descriptors and threads, sampled every turn, reported
from the end of the warm-up (--warmup turns) to the end; turns and interrupts done; seconds per turn
by kind. Exit code 0 only when every check held and RSS grew less than --max-growth percent.

    python scripts/soak_chat.py [MODEL] [--turns 1000] [--seed 0] [--max-tokens 32] [--ctx 1024] [--threads 2]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pexpect

PROMPT = ">>> "
WORDS = ("the quick brown fox jumps over the lazy dog while a small model writes careful answers about "
         "rivers mountains kernels caches tokens numbers and the weather of distant places").split()
QUESTIONS = ("What is the capital of France?", "Name three colours.", "Why is the sky blue?",
             "Write a haiku about rain.", "What is 12 times 7?", "Give me a word that rhymes with cat.",
             "Summarize the plot of a fairy tale in one sentence.", "What do cats eat?")
UNICODE = ("Traduis « café crème » en anglais, s'il te plaît.", "日本語で挨拶してください。",
           "Что такое квантование?", "Emoji test 😀👍🏽🇫🇷 — what do they mean?", "¿Dónde está la biblioteca? ñ ü ß",
           "Zero\u200bwidth and combining e\u0301 characters", "مرحبا، كيف حالك؟", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters ∑∫√∞ ≠ ≤",
           "Tabs\tand   spaces   inside")
LONG_ASK = ("Tell me a very long story about a dragon and a knight, with many chapters.",
            "List one hundred animals, one per line, with a sentence about each.",
            "Explain in great detail how a computer works, from transistors to programs.")
# what each turn kind weighs in the random mix
KINDS = {"normal": 30, "unicode": 8, "interrupt": 10, "interrupt-prefill": 4, "half-typed ctrl-c": 4,
         "multiline": 4, "multiline ctrl-c": 2, "empty": 5, "paste near the limit": 5, "paste over the limit": 2,
         "command": 26}


def _as_at_a_terminal() -> None:
    # a script started as a background job has SIGINT ignored, and children inherit that: Ctrl-C
    # would never reach the chat
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def proc_status(pid: int) -> dict:
    s = Path(f"/proc/{pid}/status").read_text()
    return {"rss_mb": int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) / 1024,
            "threads": int(re.search(r"Threads:\s+(\d+)", s).group(1)),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def flat(text: str) -> str:
    """Terminal output with rich's line wrapping undone, for matching messages that may wrap."""
    return re.sub(r"\s+", " ", text.replace("\r", ""))


class Failure(Exception):
    """A check that did not hold; the soak stops at the first one, with the transcript's tail."""


@dataclass
class Soak:
    child: pexpect.spawn
    rng: random.Random
    ctx: int
    workdir: Path
    turn_timeout: float
    max_tokens: int  # ordinary replies' limit, put back after an interrupted long one
    messages: int = 0  # what the conversation should hold, counted as the turns go
    done: collections.Counter = field(default_factory=collections.Counter)  # turns by kind
    commands: collections.Counter = field(default_factory=collections.Counter)  # command turns by command
    seconds: dict = field(default_factory=lambda: collections.defaultdict(list))  # kind -> seconds per turn
    dropped: int = 0  # messages the chat said it dropped to fit the context
    stopped: int = 0  # replies that showed "(stopped)"
    raced: int = 0  # interrupts that came after the reply had ended (the half-typed guard caught them)
    withdrawn: int = 0  # interrupts that came before the reply began: the message was taken back
    empty_replies: int = 0
    saved: int = 0

    # -- driving the terminal ---------------------------------------------------------------------

    def until_prompt(self) -> str:
        """What the chat printed until its next prompt; fails on exit, hang or traceback."""
        i = self.child.expect_exact([PROMPT, pexpect.EOF, pexpect.TIMEOUT], timeout=self.turn_timeout)
        out = self.child.before
        if i == 1:
            raise Failure(f"the chat exited (status {self._status()}); last output: {out[-2000:]!r}")
        if i == 2:
            raise Failure(f"no prompt within {self.turn_timeout:.0f} s; last output: {out[-2000:]!r}")
        if "Traceback" in out:
            raise Failure(f"traceback in the output: {out[-3000:]}")
        return out

    def _status(self) -> str:
        self.child.close()
        return f"exit {self.child.exitstatus}, signal {self.child.signalstatus}"

    def say(self, line: str) -> str:
        self.child.sendline(line)
        return self.until_prompt()

    def reply_done(self, out: str, sent: str) -> None:
        """Book a turn that reached the model: two messages, less what the chat dropped to fit."""
        self.messages += 2
        f = flat(out)
        m = re.search(r"dropped the (\d+) oldest messages", f)
        if m:
            self.messages -= int(m.group(1))
            self.dropped += int(m.group(1))
        if "(stopped)" in f:
            self.stopped += 1
        if "error:" in f:
            raise Failure(f"an error answered {sent[:80]!r}: {f[-500:]}")

    # -- the turn kinds -----------------------------------------------------------------------------

    def normal(self, line: str) -> None:
        out = self.say(line)
        self.reply_done(out, line)
        # the echo of the line is in `out`; anything after it is the reply
        if not flat(out).replace(flat(line), "", 1).strip():
            self.empty_replies += 1

    def interrupt(self, during_prefill: bool) -> None:
        if during_prefill:
            # a mark no word list repeats, to see the end of the echo: a Ctrl-C while readline still
            # takes the line in would be one on a half-typed line
            mark = f"(ref {self.rng.randrange(10**6):06d})"
            line = "Answer briefly. " + self.words(int(self.ctx * self.rng.uniform(0.3, 0.6))) + " " + mark
        else:
            self.say("/set max_tokens 2000")
            line = mark = self.rng.choice(LONG_ASK)
        self.child.sendline(line)
        self.child.expect_exact(mark, timeout=self.turn_timeout)  # the echo has ended
        if during_prefill:
            time.sleep(self.rng.uniform(0.0, 0.3))
        else:
            self.child.expect(r"\w", timeout=self.turn_timeout)  # the reply has started
            time.sleep(self.rng.uniform(0.0, 1.5))
        # A character first: if the reply has already ended, the Ctrl-C finds a half-typed line at the
        # prompt (dropped, the chat stays) rather than an empty one (which exits); if the reply is still
        # going, the Ctrl-C flushes the character from the terminal's input.
        self.child.send("x")
        self.child.sendintr()
        out = self.until_prompt()
        if "(stopped)" not in out:
            # the prompt we caught was the one after the finished reply; the guard line comes next
            self.raced += 1
            out += self.until_prompt()
        before = self.messages
        self.reply_done(out, line)
        # Stopped before the reply began (while the prompt was rendered), the message is withdrawn;
        # stopped later, it stays with the partial reply. Either, and nothing else.
        n = self.shown()[2]
        if n == before and "(stopped)" in out and "dropped the" not in flat(out):
            self.withdrawn += 1
            self.messages = n
        elif n != self.messages:
            raise Failure(f"after an interrupt the conversation holds {n} messages, expected {self.messages} "
                          f"(or {before} had the message been withdrawn)")
        if not during_prefill:
            self.say("/set max_tokens %d" % self.max_tokens)

    def half_typed_ctrl_c(self) -> None:
        self.child.send(self.words(self.rng.randint(1, 12)))
        time.sleep(self.rng.uniform(0.0, 0.3))
        self.child.sendintr()
        self.until_prompt()

    def multiline(self, interrupt: bool) -> None:
        lines = [self.words(self.rng.randint(1, 10)) for _ in range(self.rng.randint(1, 5))]
        self.child.sendline('"""' + self.rng.choice(["", "Read this: "]))
        for ln in lines:
            self.child.sendline(ln)
        if interrupt:
            time.sleep(0.1)
            self.child.sendintr()  # inside the message: it is dropped, the chat asks again
            self.until_prompt()
            return
        self.child.sendline('end."""')
        self.reply_done(self.until_prompt(), lines[0])

    def paste(self, over: bool) -> None:
        n = int(self.ctx * (self.rng.uniform(1.2, 2.0) if over else self.rng.uniform(0.5, 0.9)))
        text = "Please summarize this text: " + self.words(n)
        out = flat(self.say(text))
        if over:
            if "the message alone has" not in out:
                raise Failure(f"a paste of {n} words into a context of {self.ctx} got no error: {out[-300:]}")
            return  # refused: the conversation must be as it was (checked by the next /show)
        self.reply_done(out, text)

    def command(self) -> str:
        r = self.rng
        kind = r.choice(["/help", "/show", "/stats", "/set", "/set bad", "/set think", "/system", "/clear",
                         "/save", "/load", "/load bad", "unknown"])
        if kind == "/help":
            self.expect_in(self.say(r.choice(["/help", "/?"])), "Commands:")
        elif kind == "/show":
            self.check_count()
        elif kind == "/stats":
            out = flat(self.say("/stats"))
            if "no reply yet" not in out and not re.search(r"reply \d+ tok", out):
                raise Failure(f"/stats: {out}")
        elif kind == "/set":
            name, value = r.choice([("temperature", r.choice(["0", "0.7", "1.2"])), ("top_k", str(r.randint(0, 80))),
                                    ("top_p", r.choice(["0.5", "0.95", "1.0"])), ("min_p", r.choice(["0", "0.1"])),
                                    ("seed", str(r.randint(0, 10**6))), ("repeat_penalty", r.choice(["1.0", "1.1"]))])
            self.expect_in(self.say(f"/set {name} {value}"), f"{name} = ")
        elif kind == "/set bad":
            line = r.choice(["/set temperature -1", "/set top_k lots", "/set nonsense 3", "/set", "/set max_tokens",
                             "/set top_p 7"])
            self.expect_in(self.say(line), "error:", "usage:")
        elif kind == "/set think":
            self.expect_in(self.say(f"/set think {r.choice(['on', 'off', 'maybe'])}"), "think")
        elif kind == "/system":
            if r.random() < 0.3:
                self.expect_in(self.say("/system"), "system prompt cleared")
            else:
                self.expect_in(self.say(f"/system {r.choice(['Be brief.', 'Answer like a pirate 🏴‍☠️.'])}"),
                               "system prompt set")
        elif kind == "/clear":
            self.expect_in(self.say("/clear"), "new conversation")
            self.messages = 0
        elif kind == "/save":
            path = self.workdir / f"conv{self.saved % 3}.json"
            self.expect_in(self.say(f"/save {path}"), f"saved {self.messages} messages")
            data = json.loads(path.read_text(encoding="utf-8"))
            roles = [m["role"] for m in data["messages"]]
            if len(roles) != self.messages or any(a == b for a, b in zip(roles, roles[1:])):
                raise Failure(f"/save wrote {roles}, expected {self.messages} alternating messages")
            self.saved += 1
        elif kind == "/load":
            saved = sorted(self.workdir.glob("conv*.json"))
            if not saved:
                return self.command()
            path = r.choice(saved)
            n = len(json.loads(path.read_text(encoding="utf-8"))["messages"])
            self.expect_in(self.say(f"/load {path}"), f"loaded {n} messages")
            self.messages = n
        elif kind == "/load bad":
            bad = self.workdir / "bad.json"
            bad.write_text(r.choice(["{not json", '{"messages": [{"role": "robot"}]}', "\x00\xff"]), encoding="utf-8")
            target = r.choice([bad, self.workdir / "missing.json", self.workdir])
            self.expect_in(self.say(f"/load {target}"), "error:")
        else:
            self.expect_in(self.say(r.choice(["/frobnicate", "/", "/SHOW", "/save"])), "unknown command", "usage:")
        return kind

    # -- checks ---------------------------------------------------------------------------------------

    def expect_in(self, out: str, *any_of: str) -> None:
        if not any(s in flat(out) for s in any_of):
            raise Failure(f"expected one of {any_of} in {flat(out)[-500:]!r}")

    def shown(self) -> tuple[int, int, int]:
        """/show's context line: (tokens used, context size, messages)."""
        out = flat(self.say("/show"))
        m = re.search(r"context: (\d+) of (\d+) tokens used by (\d+) messages", out)
        if m is None:
            raise Failure(f"/show: {out}")
        return tuple(map(int, m.groups()))

    def check_count(self) -> None:
        used, n_ctx, n = self.shown()
        if n != self.messages:
            raise Failure(f"the conversation holds {n} messages, expected {self.messages} (a turn lost or doubled)")
        if used >= n_ctx:
            raise Failure(f"/show: {used} of {n_ctx} tokens used")

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))


def ctrl_c_at_empty_prompt_exits(cmd: list[str], env: dict) -> None:
    child = pexpect.spawn(cmd[0], cmd[1:], env=env, encoding="utf-8", timeout=300, dimensions=(50, 200),
                          preexec_fn=_as_at_a_terminal)
    child.expect_exact(PROMPT)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    if child.exitstatus != 0 or "Traceback" in (child.before or ""):
        raise Failure(f"Ctrl-C at an empty prompt: exit {child.exitstatus}, signal {child.signalstatus}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="pulled name or .gguf path (default: the embedded model)")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="the turn mix and the chat's sampling seed")
    ap.add_argument("--max-tokens", type=int, default=32, help="most tokens per ordinary reply")
    ap.add_argument("--ctx", type=int, default=1024, help="context size: pastes are sized against it")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=100, help="turns before RSS, fds and threads are compared")
    ap.add_argument("--max-growth", type=float, default=5.0, help="RSS growth after the warm-up that fails, percent")
    ap.add_argument("--check-every", type=int, default=10, help="turns between /show message-count checks")
    ap.add_argument("--turn-timeout", type=float, default=300)
    ap.add_argument("--transcript", type=Path, help="write everything the chat printed here")
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="soak_chat_") as tmp:
        workdir = Path(tmp)
        # a home of its own: the soak's thousands of lines never reach the user's readline history
        # (the model's path is given, so nothing else is looked up there)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TERM="dumb", COLUMNS="200", LC_ALL="C.UTF-8",
                   INFER_HOME=str(workdir / "home"))
        if a.model is None:
            from infer.models.default import default_model_path

            model = str(default_model_path())  # assembled once, before the clock starts
        else:
            model = a.model
        cmd = [sys.executable, "-m", "infer.cli", "chat", model, "--max-tokens", str(a.max_tokens), "--ctx",
               str(a.ctx), "--threads", str(a.threads), "--seed", str(a.seed)]
        return run(a, cmd, env, workdir)


def run(a: argparse.Namespace, cmd: list[str], env: dict, workdir: Path) -> int:
    rng = random.Random(a.seed)
    failure = None
    try:
        ctrl_c_at_empty_prompt_exits(cmd, env)
    except (Failure, pexpect.ExceptionPexpect) as e:
        failure = f"before the session: {e}"
    child = pexpect.spawn(cmd[0], cmd[1:], env=env, encoding="utf-8", timeout=a.turn_timeout,
                          dimensions=(50, 200), preexec_fn=_as_at_a_terminal)
    transcript = open(a.transcript, "w", encoding="utf-8") if a.transcript else None
    child.logfile_read = transcript
    soak = Soak(child, rng, a.ctx, workdir, a.turn_timeout, a.max_tokens)
    samples: list[dict] = []
    warm = end = None
    t_start = time.time()
    kinds, weights = list(KINDS), list(KINDS.values())
    try:
        if failure is None:
            soak.until_prompt()
            for turn in range(a.turns):
                kind = rng.choices(kinds, weights)[0]
                t = time.time()
                if kind == "normal":
                    soak.normal(rng.choice(QUESTIONS) if rng.random() < 0.6 else soak.words(rng.randint(3, 30)) + "?")
                elif kind == "unicode":
                    soak.normal(rng.choice(UNICODE))
                elif kind in ("interrupt", "interrupt-prefill"):
                    soak.interrupt(during_prefill=kind == "interrupt-prefill")
                elif kind == "half-typed ctrl-c":
                    soak.half_typed_ctrl_c()
                elif kind in ("multiline", "multiline ctrl-c"):
                    soak.multiline(interrupt=kind == "multiline ctrl-c")
                elif kind == "empty":
                    soak.say(rng.choice(["", " ", "   ", "\t"]))
                elif kind.startswith("paste"):
                    soak.paste(over=kind == "paste over the limit")
                else:
                    soak.commands[soak.command()] += 1
                soak.done[kind] += 1
                soak.seconds[kind].append(time.time() - t)
                if (turn + 1) % a.check_every == 0:
                    soak.check_count()
                samples.append(proc_status(child.pid))
                if turn + 1 == a.warmup:
                    warm = samples[-1]
            soak.check_count()
            elapsed = time.time() - t_start
            end = proc_status(child.pid)
            child.sendeof()
            child.expect(pexpect.EOF, timeout=60)
            if "Traceback" in child.before:
                raise Failure(f"traceback at exit: {child.before[-3000:]}")
            child.close()
            if child.exitstatus != 0:
                raise Failure(f"Ctrl-D: exit {child.exitstatus}, signal {child.signalstatus}")
    except (Failure, pexpect.ExceptionPexpect, OSError) as e:
        failure = failure or f"turn {sum(soak.done.values()) + 1}: {e}"
        elapsed = time.time() - t_start
    finally:
        if child.isalive():
            child.terminate(force=True)
        if transcript:
            transcript.close()

    turns = sum(soak.done.values())
    interrupts = soak.done["interrupt"] + soak.done["interrupt-prefill"]
    print(f"infer chat soak: {turns} of {a.turns} turns in {elapsed:.0f} s ({elapsed / max(turns, 1):.2f} s per turn), "
          f"seed {a.seed}, --max-tokens {a.max_tokens}, --ctx {a.ctx}, --threads {a.threads}")
    print("turns: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.done.items())))
    print("commands: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.commands.items())))
    print(f"interrupts mid-reply or mid-prefill: {interrupts} ({soak.stopped} showed '(stopped)', of which "
          f"{soak.withdrawn} before the reply began; {soak.raced} came after the reply had ended); "
          f"half-typed and multi-line Ctrl-C: "
          f"{soak.done['half-typed ctrl-c'] + soak.done['multiline ctrl-c']}; Ctrl-C at an empty prompt exited 0")
    print(f"messages dropped to fit the context: {soak.dropped}; empty replies: {soak.empty_replies}; "
          f"/save files checked: {soak.saved}")
    print("seconds per turn: " + ", ".join(
        f"{k} {statistics.median(v):.2f} (max {max(v):.1f})" for k, v in sorted(soak.seconds.items())))
    grew = None
    if samples:
        warm = warm or samples[0]
        end = end or samples[-1]
        peak = max(s["rss_mb"] for s in samples)
        grew = (end["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"] * 100
        print(f"RSS after {min(a.warmup, len(samples))} warm-up turns: {warm['rss_mb']:.0f} -> {end['rss_mb']:.0f} MiB "
              f"({grew:+.1f}%, bound +{a.max_growth:g}%; peak {peak:.0f}, first turn {samples[0]['rss_mb']:.0f}); "
              f"fds {warm['fds']} -> {end['fds']}; threads {warm['threads']} -> {end['threads']}")
        if failure is None and (grew > a.max_growth or end["fds"] > warm["fds"] or end["threads"] > warm["threads"]):
            failure = "resources grew after the warm-up"
    print(f"exit: {'Ctrl-D, code 0' if failure is None else 'FAILED'}")
    if failure:
        print(f"FAILED: {failure}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
