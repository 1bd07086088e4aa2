""""did you mean" for flags: argparse's unknown flag -> the closest flag the command knows
(the rule, trainwise.common.suggest, is the one model and GPU names use)."""

from __future__ import annotations

import argparse

from trainwise.common.suggest import closest


def unknown_flags_message(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """"unknown flag --seqlen (did you mean --seq-len?)" for the flags among `extras` (the
    arguments argparse did not recognise), against the flags `parser` knows."""
    flags = [token.split("=", 1)[0] for token in extras if token.startswith("-")]
    if not flags:
        return f"unexpected arguments: {' '.join(extras)}"
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    parts = []
    for flag in flags:
        match = closest(flag, known)
        parts.append(f"{flag} (did you mean {match}?)" if match else flag)
    noun = "flag" if len(parts) == 1 else "flags"
    return f"unknown {noun} {', '.join(parts)}; see --help"
