"""The built-in corpus: real English text that needs no download and ships nothing.

It is gathered at run time from the documentation strings of a fixed list of Python
standard-library modules (their modules, classes, functions and methods, in sorted
order), which every Python installation carries. About a megabyte of technical prose:
enough for a small language model's loss to fall visibly within a hundred steps."""

from __future__ import annotations

import functools
import importlib
import inspect

MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "configparser", "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message",
    "enum", "fractions", "ftplib", "functools", "gettext", "heapq", "hmac", "html.parser", "http.client",
    "imaplib", "inspect", "ipaddress", "itertools", "json", "logging", "mailbox", "multiprocessing.pool",
    "optparse", "os", "pathlib", "pickle", "pprint", "queue", "random", "sched", "shutil", "smtplib",
    "socketserver", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "tkinter", "trace", "turtle", "typing", "unittest.case", "urllib.parse", "urllib.request", "uuid",
    "wave", "xml.dom.minidom", "zipfile",
)
SOURCE_NAME = "Python standard-library docstrings"


@functools.lru_cache(maxsize=1)
def builtin_documents() -> tuple[str, ...]:
    """The corpus as documents (one per docstring), in a fixed order."""
    documents: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # e.g. tkinter is optional in some Python builds
            continue
        documents.extend(_docstrings(module))
    return tuple(documents)


def _docstrings(module) -> list[str]:
    found = [inspect.getdoc(module) or ""]
    for attribute in sorted(vars(module)):
        value = getattr(module, attribute)
        if attribute.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(value) or inspect.isfunction(value):
            found.append(inspect.getdoc(value) or "")
        if inspect.isclass(value):
            for method in sorted(vars(value)):
                member = vars(value)[method]
                if not method.startswith("_") and inspect.isfunction(member):
                    found.append(inspect.getdoc(member) or "")
    return [text for text in found if len(text) > 40]
