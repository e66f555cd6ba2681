# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: import this collection's module_utils from an AnsiballZ zip, compiling once.

AnsiballZ ships a module's module_utils as sources in a zip. CPython's path finder asks a zipimporter for
a module's file name while it builds the module's spec, and zipimporter.get_filename() compiles the source
to answer; loading then compiles it again (CPython 3.8 to 3.13 alike). For lock, lock_info and locked
that second compilation of the engine is about 17 ms of every task on Python 3.8.

Importing this module (first, before the engine) puts a finder before the path finder that, for this
collection's module_utils found in a zip only, builds the spec from the zip's table of contents (no
compilation) and loads the module with one zipimporter.get_code(): same zip, same code, same module
attributes, once. Anything else (a module_utils directory on disk, another package, a name the zip does
not have) is left to the usual finders. Nothing is written anywhere and nothing outside the zip is read.

Compiling the engine is still most of what a lock adds to a module run (about 30 ms of Python 3.8's
time). So a run can also hand its compiled modules back (exported(): this interpreter's magic number
and version, then the code objects, marshalled and compressed), and a later run of the same
interpreter on the same host, as the same user, can start from them (preload()): the controller keeps
them for the rest of the ansible-playbook run (plugins/plugin_utils/_hostcode.py). Code compiled by
another interpreter (another magic number or version) is never loaded: those modules are compiled from
the zip as usual.
"""

from __future__ import annotations

import marshal
import sys
import zipimport
import zlib  # zipimport's own: already loaded to read the zip
from importlib._bootstrap_external import MAGIC_NUMBER  # loaded with importlib.machinery: costs nothing
from importlib.machinery import ModuleSpec, PathFinder

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from types import CodeType, ModuleType
    from typing import Any

PREFIX = __name__.rsplit(".", 1)[0] + "."  # ansible_collections.hostlock.core.plugins.module_utils.
# What compiled code is tagged with: it is loaded only by an interpreter with the same tag.
TAG = b"hostlock-code/1\0" + MAGIC_NUMBER + sys.version.encode("utf-8", "replace") + b"\0"
# Names relative to this package (`hostlock.host.kernel`, `_runner`): the same code serves plugin_utils/
# _engine_call.py, which runs engine modules on the host under those short names.
PRELOADED: dict = {}  # name -> code object, from preload(): used instead of compiling that module
LOADED: dict = {}  # name -> code object of each module this finder loaded, for exported()
COMPILED: list = []  # names of the modules this finder compiled (not given by preload)


def preload(blob: bytes) -> bool:
    """Use the code objects of `blob` (an exported() of this interpreter) for the modules imported from now
    on; False, and nothing used, when `blob` is not this interpreter's or is damaged."""
    if not blob.startswith(TAG):
        return False
    try:
        code = marshal.loads(zlib.decompress(blob[len(TAG):]))
    except (ValueError, EOFError, TypeError, zlib.error):
        return False
    if not isinstance(code, dict):
        return False
    PRELOADED.update((k, v) for k, v in code.items() if isinstance(k, str) and type(v).__name__ == "code")
    return True


def take(name: str) -> CodeType | None:
    """The preloaded code of module `name` (relative to this package), once; None: compile it."""
    return PRELOADED.pop(name, None)


def compiled_here() -> bool:
    """Whether this run compiled a module the preload()ed code lacks: only then has it code to hand back.

    A module imported before preload() could run (the calling module's own imports: its argument spec) is
    compiled in every run although the code given holds it; counting it would send all the code back, and
    store it again, on every run. Its given code is still in PRELOADED (take() pops a module's code only when
    that module is imported after preload()), and a module compiled after preload() is one the code lacks."""
    return any(name not in PRELOADED for name in COMPILED)


def exported() -> bytes:
    """This interpreter's tag and the code objects of every module this finder loaded or was given (see
    preload): what a later run of this interpreter needs so as to compile nothing."""
    return TAG + zlib.compress(marshal.dumps({**PRELOADED, **LOADED}), 6)  # a third of the size, ~1 ms


class ZipLoader:
    """A zipimporter's module, compiled once by exec_module (the spec needed no compilation)."""

    def __init__(self, importer: zipimport.zipimporter, filename: str) -> None:
        self.importer = importer
        self.filename = filename

    def __getattr__(self, attr: str) -> Any:  # get_source, get_data, is_package, ... as the zipimporter's
        return getattr(self.importer, attr)

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)  # noqa: S102 - what every loader does

    def get_code(self, name: str) -> CodeType:
        short = name[len(PREFIX):]
        code = take(short)
        if code is None:
            code = self.importer.get_code(name)
            COMPILED.append(short)
        LOADED[short] = code
        return code

    def get_filename(self, name: str) -> str:
        return self.filename  # what zipimporter would answer, without compiling the module to find out


class ZipFinder:
    """Specs for this collection's module_utils inside a zip on the parent package's path."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if not name.startswith(PREFIX) or name == __name__ or not path:
            return None
        last = name.rpartition(".")[2]
        for entry in path:
            importer = _zip_importer(entry)
            if importer is None:
                continue
            try:
                package = importer.is_package(name)  # the zip's table of contents: no compilation
            except zipimport.ZipImportError:
                continue
            where = importer.archive + "/" + importer.prefix + last
            filename = where + ("/__init__.py" if package else ".py")
            loader: Any = ZipLoader(importer, filename)  # a Loader by protocol (importlib.abc costs an import)
            spec = ModuleSpec(name, loader, origin=filename, is_package=package)
            spec.has_location = True  # __file__ as zipimport sets it
            if package:
                spec.submodule_search_locations = [where]
            return spec
        return None


def _zip_importer(entry: Any) -> zipimport.zipimporter | None:
    """The zipimporter for a path entry inside a zip (as the path finder would make and cache it), else None."""
    if not isinstance(entry, str) or ".zip" not in entry:
        return None
    importer: Any = sys.path_importer_cache.get(entry)
    if importer is None:
        try:
            importer = zipimport.zipimporter(entry)
        except (zipimport.ZipImportError, OSError):
            return None
        sys.path_importer_cache[entry] = importer
    return importer if isinstance(importer, zipimport.zipimporter) else None


def install() -> None:
    """Put the finder just before the path finder in sys.meta_path, once per process.

    Not first: finders placed ahead of the path finder (ansible-test's import checker, an embedding
    application's) still see every import first, as they expect.
    """
    if any(isinstance(f, ZipFinder) for f in sys.meta_path):
        return
    at = next((i for i, f in enumerate(sys.meta_path) if f is PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, ZipFinder())


install()
