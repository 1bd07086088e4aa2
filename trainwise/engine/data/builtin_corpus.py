"""The built-in corpus: real English text that needs no download and ships nothing.

It is gathered at run time from the documentation strings of a fixed list of Python
standard-library modules (each module, and its public classes, functions, methods and
properties, in sorted order), which every CPython installation carries. That is about
0.9 MB of technical prose in some 3,300 documents, read in a few tenths of a second,
so it is rebuilt rather than cached: enough text for a small language model's loss to
fall visibly within a hundred steps. The exact text follows the Python version."""

from __future__ import annotations

import functools
import importlib
import inspect
from types import ModuleType

SOURCE_NAME = "Python standard-library docstrings"
MIN_DOCUMENT_CHARS = 40  # shorter docstrings ("Return self.") teach little

# Pure-Python or always-built modules only (no tkinter, sqlite3, ...), so that every
# CPython build yields the same corpus. _pydecimal and _pyio are the documented Python
# twins of the C decimal and io modules.
MODULES = (
    "_pydecimal", "_pyio", "argparse", "ast", "asyncio.base_events", "asyncio.events", "asyncio.locks",
    "asyncio.queues", "asyncio.streams", "asyncio.tasks", "base64", "bdb", "bisect", "builtins", "calendar",
    "cmd", "code", "codecs", "collections", "concurrent.futures", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "difflib", "dis", "doctest", "email.headerregistry", "email.message",
    "email.utils", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob",
    "graphlib", "gzip", "heapq", "hmac", "html.parser", "http.client", "http.cookiejar", "http.server",
    "imaplib", "importlib.metadata", "inspect", "ipaddress", "itertools", "json", "locale", "logging",
    "logging.handlers", "mailbox", "math", "mimetypes", "multiprocessing.pool", "netrc", "numbers", "operator",
    "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "plistlib", "poplib", "pprint", "pydoc",
    "queue", "random", "reprlib", "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket",
    "socketserver", "statistics", "string", "struct", "subprocess", "sys", "tarfile", "tempfile", "textwrap",
    "threading", "time", "timeit", "tokenize", "trace", "traceback", "types", "typing", "unittest.case",
    "unittest.mock", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref",
    "xml.dom.minidom", "xml.etree.ElementTree", "xmlrpc.client", "zipfile",
)


@functools.lru_cache(maxsize=1)
def builtin_documents() -> tuple[str, ...]:
    """The corpus as documents (one per docstring), in a fixed order."""
    documents: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a trimmed-down Python; the corpus is then a little smaller
            continue
        documents.extend(_module_docstrings(module))
    return tuple(documents)


def _module_docstrings(module: ModuleType) -> list[str]:
    found = [inspect.getdoc(module)]
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue  # private, or imported from elsewhere (documented there)
        if inspect.isclass(value):
            found.append(inspect.getdoc(value))
            found.extend(_member_docstrings(value))
        elif inspect.isroutine(value):
            found.append(inspect.getdoc(value))
    return [text for text in found if text and len(text) >= MIN_DOCUMENT_CHARS]


def _member_docstrings(cls: type) -> list[str | None]:
    found = []
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if inspect.isroutine(member) or inspect.isdatadescriptor(member):
            found.append(inspect.getdoc(member))
    return found
