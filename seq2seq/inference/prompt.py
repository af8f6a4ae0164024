"""The interactive prompt of `seq2seq-translate`: translate lines, show the attention.

Each line is translated with beam search; a line starting with ":" is a command
(:attn, :save FILE.png, :beam N, :nbest N, :help, :quit). Nothing the user types
ends the session except :quit and Ctrl-D: a bad command gets one line of help,
Ctrl-C cancels the translation in progress (or clears the line being typed).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

from seq2seq.config import check_beam
from seq2seq.errors import Seq2SeqError
from seq2seq.inference.heatmap import render_heatmap, save_heatmap
from seq2seq.inference.translator import (
    Translation,
    Translator,
    repair_text,
    truncation_warning,
)

HELP = """\
Type a sentence to translate it. Commands:
  :attn [on|off]   show/hide the attention heatmap (target subwords x source subwords)
  :save FILE.png   write the last heatmap as an image
  :beam N          beam size (1 = greedy)
  :nbest N         show the N best translations (N <= beam)
  :help            this help
  :quit            leave (Ctrl-D works too; Ctrl-C cancels a running translation)
A line that starts with ":" is a command; start it with a space to translate it."""


def make_session(history_file: str, err: IO[str], **kwargs: Any) -> Any:
    """A prompt_toolkit PromptSession with a history file (in memory if it cannot be used).

    ``kwargs`` go to PromptSession (tests pass ``input``/``output``).
    """
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    history: Any = InMemoryHistory()
    if history_file:
        path = Path(history_file).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            history = FileHistory(str(path))
        except OSError as e:
            print(f"warning: history file {path} unusable ({e.strerror}); history kept in memory "
                  "only (set history_file=)", file=err)
    return PromptSession(history=history, **kwargs)


class Repl:
    """The read-translate-print loop; ``settings`` holds beam, nbest, attention and
    history_file (a TranslateConfig)."""

    def __init__(self, translator: Translator | Future[Translator], settings: Any,
                 session: Any = None, out: IO[str] | None = None, err: IO[str] | None = None,
                 width: Callable[[], int] | None = None) -> None:
        self._translator = translator
        self.beam, self.nbest = int(settings.beam), int(settings.nbest)
        self.show_attention = bool(settings.attention)
        self.history_file = str(settings.history_file)
        self.session = session
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.width = width or (lambda: shutil.get_terminal_size((100, 24)).columns)
        self.last: Translation | None = None
        self.commands: dict[str, Callable[[list[str]], bool]] = {
            "attn": self.cmd_attn, "save": self.cmd_save, "beam": self.cmd_beam,
            "nbest": self.cmd_nbest, "help": self.cmd_help, "quit": self.cmd_quit,
            "q": self.cmd_quit, "exit": self.cmd_quit,
        }

    @property
    def translator(self) -> Translator:
        """The Translator; while it is still loading in the background, wait for it.

        A failed load (CheckpointError) is re-raised here and ends the session: there is
        no model to translate with.
        """
        if isinstance(self._translator, Future):
            self._translator = self._translator.result()
        return self._translator

    def load_failed(self) -> bool:
        """True if the background load has already failed (the next wait raises it)."""
        t = self._translator
        return isinstance(t, Future) and t.done() and t.exception() is not None

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def warn(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def run(self) -> None:
        """Prompt until :quit or Ctrl-D."""
        if self.session is None:
            self.session = make_session(self.history_file, self.err)
        self.say(f"beam {self.beam}, nbest {self.nbest}, attention heatmap "
                 f"{'on' if self.show_attention else 'off'}; :help for commands, Ctrl-D to leave")
        while True:
            try:
                line = self.session.prompt("> ")
            except KeyboardInterrupt:  # Ctrl-C while typing: drop the line, keep the prompt
                continue
            except EOFError:  # Ctrl-D
                break
            try:
                if not line.startswith(":") or self.load_failed():
                    self.translator  # noqa: B018 -- wait for the model; a load error ends the session
            except KeyboardInterrupt:
                self.warn("translation cancelled")
                continue
            if not self.handle(line):
                break

    def handle(self, line: str) -> bool:
        """One input line; False when the session should end."""
        try:
            if line.startswith(":"):
                return self.command(line[1:])
            self.translate_line(line)
        except KeyboardInterrupt:  # Ctrl-C during a translation: cancel it, keep the prompt
            self.warn("translation cancelled")
        except Seq2SeqError as e:
            self.warn(f"error: {e}")
        except Exception as e:  # a bug must not end the session; the fuzz test keeps this unused
            self.warn(f"error: unexpected {type(e).__name__}: {e}; the prompt goes on")
        return True

    def translate_line(self, line: str) -> None:
        text, repaired = repair_text(line)
        if repaired:
            self.warn("warning: invalid UTF-8 replaced by U+FFFD")
        if not text.strip():
            self.say()
            return
        [result] = self.translator.translate([text], beam=self.beam, nbest=self.nbest)
        if result.truncated:
            self.warn(truncation_warning("this line", self.translator.max_src_tokens))
        self.last = result
        if self.nbest == 1:
            self.say(result.text)
        else:
            for rank, hyp in enumerate([result, *result.alternatives], start=1):
                self.say(f"{rank}. {hyp.text}  ({hyp.score:.3f})")
        if self.show_attention:
            self.show_heatmap()

    def show_heatmap(self) -> None:
        if self.last is None:
            self.say("(no translation yet: type a sentence)")
            return
        t = self.last
        self.say(render_heatmap(t.attention, t.src_tokens, t.tgt_tokens, width=self.width()))

    # ------------------------------------------------------------ commands

    def command(self, text: str) -> bool:
        name, *args = text.split() or [""]
        handler = self.commands.get(name.lower())
        if handler is None:
            self.warn(f"unknown command ':{name}': try :attn, :save FILE.png, :beam N, "
                      ":nbest N, :help or :quit")
            return True
        return handler(args)

    def _number(self, name: str, args: list[str]) -> int | None:
        # ASCII digits only: str.isdigit() also accepts "²", which int() then refuses
        if len(args) != 1 or not (args[0].isascii() and args[0].isdigit()) or int(args[0]) < 1:
            self.warn(f":{name} needs one whole number >= 1, e.g. :{name} 5 "
                      f"(now {getattr(self, name)})")
            return None
        return int(args[0])

    def cmd_attn(self, args: list[str]) -> bool:
        if args and args[0].lower() not in ("on", "off"):
            self.warn(":attn takes nothing (toggle), on or off")
            return True
        self.show_attention = args[0].lower() == "on" if args else not self.show_attention
        self.say(f"attention heatmap {'on' if self.show_attention else 'off'}")
        if self.show_attention and self.last is not None:
            self.show_heatmap()
        return True

    def cmd_save(self, args: list[str]) -> bool:
        if len(args) != 1:
            self.warn(":save needs one file name, e.g. :save attention.png")
        elif self.last is None or not self.last.tgt_tokens:
            self.warn(":save: nothing to save yet; translate a sentence first")
        else:
            t = self.last
            path = save_heatmap(t.attention, t.src_tokens, t.tgt_tokens, args[0])
            self.say(f"saved {path}")
        return True

    def cmd_beam(self, args: list[str]) -> bool:
        beam = self._number("beam", args)
        if beam is not None:
            try:
                check_beam(beam, self.nbest)
            except Seq2SeqError as e:
                self.warn(f"error: {e}")
                return True
            self.beam = beam
            self.say(f"beam {beam}")
        return True

    def cmd_nbest(self, args: list[str]) -> bool:
        nbest = self._number("nbest", args)
        if nbest is not None:
            try:
                check_beam(self.beam, nbest)
            except Seq2SeqError as e:
                self.warn(f"error: {e}")
                return True
            self.nbest = nbest
            self.say(f"nbest {nbest}")
        return True

    def cmd_help(self, args: list[str]) -> bool:
        self.say(HELP)
        return True

    def cmd_quit(self, args: list[str]) -> bool:
        return False
