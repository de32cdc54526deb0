"""The workbench's Rich consoles: at full width when the output is not a terminal.

Rich sizes its output to the terminal and, when it cannot read one (stdout piped to a file, a CI
log, ``tee``, a test's CliRunner), to 80 columns: a sweep table then keeps "draft_mo…" and
"1.27× [1.22, 1.33…" and loses its confidence intervals and half its columns. A log is read later
(or grepped), not on an 80-column screen, so when the console's own file is not a terminal it renders
at :data:`PIPE_WIDTH` columns instead. Tables do not expand (``expand=False``, Rich's default): they
keep their natural width, so nothing is cut and nothing is padded; text is wrapped only past
:data:`PIPE_WIDTH`. An explicit width (``Console(width=...)`` or ``$COLUMNS``) is always kept.

Renderables that fill whatever width they get (Markdown headings, rules, panels) should be printed
as plain text when :func:`is_piped` (``wb bench`` prints its Markdown source).
"""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

PIPE_WIDTH = 1000  # columns when the output is not a terminal: wider than any table the workbench prints


def _isatty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):  # closed or file-like objects without a terminal
        return False


class PipeConsole(Console):
    """A Rich :class:`~rich.console.Console` that renders at :data:`PIPE_WIDTH` columns when its file
    (``sys.stdout``/``sys.stderr`` at print time, or the ``file`` given) is not a terminal and no width
    was set (argument or ``$COLUMNS``). Colour and terminal detection are Rich's own."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is None and not _isatty(self.file):
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        width, height = new_size
        self._width, self._height = width, height


def make_console(stderr: bool = False, **kwargs) -> PipeConsole:
    """The console every command prints to: stdout (``stderr=True``: stderr); ``kwargs`` go to Rich's Console."""
    return PipeConsole(stderr=stderr, **kwargs)


def is_piped(console: Console) -> bool:
    """True when ``console`` writes to something other than a terminal (a file, a pipe, a test's capture)."""
    return not _isatty(console.file)
