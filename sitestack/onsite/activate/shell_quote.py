"""Quoting a value as one word of the shell it is written for: bash/zsh, fish, csh/tcsh."""


def sh_quote(text: str) -> str:
    """A single-quoted word for bash/zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def fish_quote(text: str) -> str:
    """A single-quoted word for fish (which also escapes backslashes inside quotes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def csh_quote(text: str) -> str:
    """A single-quoted word for csh and tcsh: ``'`` as ``'\\''``, and ``!`` as ``\\!`` (csh's history
    substitution happens inside single quotes too, in an interactive shell; the backslash is taken
    away with it, interactive or not). A newline cannot be quoted: values with one are refused first
    (:func:`.csh.csh_texts`)."""
    return "'" + text.replace("'", "'\\''").replace("!", "\\!") + "'"
