"""What every ``jaxspec`` subcommand shares: the :class:`Command` record and its
:func:`command` decorator, :class:`CLIError`, argument types, and the checks of output
folders and model flags, and the flags' names for the library's settings.

A subcommand is a function ``setup(parser) -> handler`` wrapped by :func:`command`: it adds
its arguments to its ``argparse`` subparser and returns the function that runs it::

    @command("hello", help="say hello")
    def hello_command(p: argparse.ArgumentParser) -> Handler:
        p.add_argument("--name", default="world")

        def run(args: argparse.Namespace) -> int:
            print(f"hello {args.name}")
            return 0

        return run

:mod:`jaxspec.cli.main` lists the commands it offers explicitly (``COMMANDS``).
Handlers report bad input by raising :class:`CLIError` (or ``ValueError`` /
``FileNotFoundError`` from the library): ``main`` prints ``jaxspec <cmd>: error: <msg>``
and returns exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "Command", "CLIError", "Handler", "command", "arg_type", "check_output_dir", "load_flag_model", "is_head_flag",
    "warn_if_head_for_another_target",
    "positive_int", "nonneg_int", "positive_float", "nonneg_float", "unit_float", "seed_int",
    "utf8_text", "resolve_tokenizer", "check_tokenizer_fits", "FLAGS", "in_flags", "in_flag_words", "flag_sampling",
    "jax_platform_failure",
]

Handler = Callable[[argparse.Namespace], int]

#: the library's setting names (:class:`jaxspec.SettingError`, :mod:`jaxspec.decode.combinations`)
#: -> the flags that set them; ``auto`` is the tree chosen by ``--tree auto``
FLAGS = {
    "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "max_new_tokens": "--max-new-tokens", "tree": "--tree", "scheme": "--scheme", "rule": "--rule",
    "mesh": "--mesh", "draft": "--draft", "auto": "--tree auto", "draft_sampling": "--draft-temperature",
    "horizon": "--horizon",
}


class CLIError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its name, its one-line help, ``setup(parser) -> handler``, and the exit
    status of an unexpected error (1; ``verify`` keeps 1 for "a test rejected" and uses 2)."""

    name: str
    help: str
    setup: Callable[[argparse.ArgumentParser], Handler]
    error_status: int = 1


def command(name: str, *, help: str, error_status: int = 1):  # noqa: A002 (argparse's word)
    """Decorator: ``setup(parser) -> handler`` becomes the :class:`Command` ``name``."""

    def wrap(setup: Callable[[argparse.ArgumentParser], Handler]) -> Command:
        return Command(name, help, setup, error_status)

    return wrap


def arg_type(convert, ok, what: str):
    """An argparse ``type=``: ``convert`` the string, then require ``ok(value)``; the
    message says what was expected and what was given."""

    def parse(s: str):
        try:
            v = convert(s)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v

    parse.__name__ = what.replace(" ", "_")
    return parse


positive_int = arg_type(int, lambda v: v >= 1, "a positive integer")
nonneg_int = arg_type(int, lambda v: v >= 0, "a non-negative integer")
# numbers the computation holds in float32: at most float32's largest finite number
F32_MAX = 3.4028234663852886e38  # float(numpy.finfo(numpy.float32).max), without importing numpy
positive_float = arg_type(float, lambda v: 0 < v <= F32_MAX, "a positive number (at most 3.4e38)")
nonneg_float = arg_type(float, lambda v: 0 <= v <= F32_MAX, "a non-negative number (at most 3.4e38)")
unit_float = arg_type(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
# --seed: jax.random.key keeps 32 bits of the seed (2**32 + s would give the key of s)
seed_int = arg_type(int, lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)")


def mesh_flag(s: str) -> dict[str, int]:
    """An argparse ``type=`` for ``--mesh``: ``"data=2,model=4"`` -> ``{"data": 2, "model": 4}``."""
    from jaxspec.nn.sharding import parse_mesh

    try:
        return parse_mesh(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"mesh = {s!r}: ")) from None


def flag_mesh(sizes: dict[str, int] | None):
    """The :class:`jax.sharding.Mesh` of a parsed ``--mesh`` (None stays None).

    Called before JAX starts its backends: on a machine whose only devices are the CPU,
    JAX shows one device unless ``XLA_FLAGS`` asks for more, so the flag asking for the
    mesh's device count is added when ``XLA_FLAGS`` has none (on an accelerator it only
    splits the host platform, which the mesh does not use)."""
    if sizes is None:
        return None
    from jaxspec.nn.sharding import host_device_limit, make_mesh  # JAX imported, its backends not started

    data, model = sizes.get("data", 1), sizes.get("model", 1)
    flag = "--xla_force_host_platform_device_count"
    limit = None
    if flag not in os.environ.get("XLA_FLAGS", ""):  # read when the CPU backend starts, not at import
        # at most host_device_limit(): a thousand host devices made XLA abort compiling for them
        limit = host_device_limit()
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={min(data * model, limit)}".strip()
    try:
        return make_mesh(data=data, model=model)
    except ValueError as e:
        msg = f"--mesh data={data},model={model}: {str(e).removeprefix('make_mesh: ')}"
        if limit is not None and data * model > limit and "on CPU" in msg:  # the host devices were the mesh's
            msg += f" (without XLA_FLAGS, --mesh makes at most {limit} host devices: max(8, CPU cores))"
        raise CLIError(msg) from None


def in_flags(e, args: argparse.Namespace | None = None, flags: dict[str, str] | None = None) -> str:
    """A :class:`jaxspec.SettingError`'s message in the command line's words: each setting
    as its flag (``flags`` over :data:`FLAGS`) and the value the flag was given (the
    library's value when ``args`` has none), e.g. ``--scheme iid and --tree
    dynamic:depth=3,topk=2,nodes=6: expected ...``."""
    flags = {**FLAGS, **(flags or {})}

    def name_value(name, value):
        flag = flags.get(name)
        if flag is None:
            return f"{name} = {value!r}"
        if value is True:  # a switch: the flag says it
            return flag
        if value is None:  # a flag not given
            return f"no {flag}"
        given = getattr(args, name, None) if args is not None and name in FLAGS else None
        shown = value if given is None else given
        if isinstance(shown, dict):  # --mesh data=2,model=4
            shown = ",".join(f"{k}={v}" for k, v in shown.items())
        return f"{flag} {shown}"

    return e.render(name_value)


def in_flag_words(e: ValueError, args: argparse.Namespace) -> str:
    """A library ``ValueError`` that names a model argument (``draft: vocab_size = 48;
    expected the target's vocab_size = 40``) in the command line's words: the argument as
    its flag and the value the flag was given (``--draft models/d: vocab_size = 48; ...``);
    any other message as it is."""
    msg = str(e)
    for name, flag in (("draft", "--draft"), ("target", "--target")):
        if msg.startswith(f"{name}: ") and getattr(args, name, None) is not None:
            return f"{flag} {getattr(args, name)}: {msg[len(name) + 2:]}"
    return msg


def flag_sampling(temperature, top_k, top_p, min_p, prefix: str = ""):
    """The :class:`jaxspec.Sampling` of these flags (``prefix``: ``"--draft-"`` for the
    draft's); a bad value is a :class:`CLIError` naming its flag."""
    from jaxspec.errors import SettingError
    from jaxspec.core.settings import Sampling

    try:
        return Sampling(temperature, top_k, top_p, min_p)
    except SettingError as e:
        names = ("temperature", "top_k", "top_p", "min_p")
        raise CLIError(in_flags(e, flags={n: f"{prefix or '--'}{n.replace('_', '-')}" for n in names})) from None


def utf8_text(s: str) -> str:
    """An argparse ``type=`` for text (``--prompt``): refuses a string that is not valid
    UTF-8, such as the lone surrogates (``"\\udcff"``) Python decodes undecodable
    command-line bytes into; the message names the value (repr) and its first bad bytes."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = s[e.start:e.end]
        try:
            raw = os.fsencode(bad)  # the bytes the command line held, where they came from it
        except UnicodeError:
            raw = None
        what = f"bytes {raw!r}" if raw is not None and len(raw) == len(bad) else f"characters {bad!r}"
        raise argparse.ArgumentTypeError(
            f"expected valid UTF-8 text, got {s!r} ({what} at position {e.start} are not UTF-8)"
        ) from None
    return s


def check_output_dir(flag: str, path: str | os.PathLike) -> Path:
    """Refuse, before any long work, an output folder that cannot be written.

    ``path`` must be an existing folder, or creatable: its nearest existing ancestor is a
    folder this process can create entries in. That is tried with a temporary folder,
    removed at once (``os.access`` answers yes to root for places such as ``/proc``).
    Raises :class:`CLIError` naming ``flag`` (``--out``, ``OUT_DIR``, ...) and ``path``;
    returns ``Path(path)``.
    """
    if not str(path).strip():
        raise CLIError(f"{flag} {str(path)!r}: expected a folder path, got an empty one")
    p = Path(path).expanduser()
    here = Path(os.path.abspath(p))
    anc = here
    while not os.path.lexists(anc) and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        if anc == here:
            raise CLIError(f"{flag} {path}: expected a folder, got an existing file")
        raise CLIError(f"{flag} {path}: cannot create this folder: {anc} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".jaxspec-write-test-", dir=anc))
    except OSError as e:
        where = "this folder" if anc == here else f"{anc}"
        raise CLIError(f"{flag} {path}: cannot write into {where} ({e.strerror or e})") from None
    return p


#: ``--quantize`` choices: :data:`jaxspec.nn.quant.QUANTIZE_MODES` (not imported here: it imports JAX)
QUANTIZE_MODES = ("int8",)


def load_flag_model(flag: str, name: str, *, draft: bool = False, dtype: str | None = None,
                    quantize: str | None = None):
    """``load_model(name, dtype=dtype, quantize=quantize)`` for a command's flag (``draft=True``: ``load_draft``,
    which also loads a feature head); its errors name the flag that gave ``name`` (``--draft:
    load_model: unknown model 'foo'; ...``), and a missing package (``gguf`` for a GGUF file)
    says what to install."""
    from jaxspec.formats.checkpoint import load_draft, load_model

    try:
        return (load_draft if draft else load_model)(name, dtype=dtype, quantize=quantize)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise CLIError(f"{flag}: {e}") from None


def is_head_flag(flag: str, name: str) -> bool:
    """Whether the model ``name`` that ``flag`` gave is a feature draft head."""
    from jaxspec.formats.checkpoint import resolve_model_path
    from jaxspec.formats.gguf import is_gguf_source
    from jaxspec.nn.head import is_head_folder

    if is_gguf_source(name):  # a whole model in one file: never a head folder
        return False
    try:
        return is_head_folder(resolve_model_path(name))
    except (ValueError, FileNotFoundError) as e:
        raise CLIError(f"{flag}: {e}") from None


def warn_if_head_for_another_target(flag: str, name: str, target, target_name: str) -> bool:
    """When ``name`` (the model ``flag`` gave) is a feature head folder that records the
    digest of another target than ``target`` (:func:`jaxspec.nn.head.recorded_target_digest`),
    say so on stderr and return True; any other model: False. Decoding stays lossless with any head that fits the target's
    width and vocabulary; only its acceptance suffers, so this is a warning, not an error."""
    import sys

    from jaxspec.formats.checkpoint import resolve_model_path
    from jaxspec.formats.gguf import is_gguf_source
    from jaxspec.nn.head import is_head_folder, recorded_target_digest, target_digest

    if is_gguf_source(name):  # a GGUF file is a model, never a head
        return False
    folder = resolve_model_path(name)
    recorded = recorded_target_digest(folder) if is_head_folder(folder) else None
    if recorded is None:
        return False
    actual = target_digest(target)
    if recorded == actual:
        return False
    print(f"warning: {flag} {name} was trained on a target with weight digest {recorded}, but the target "
          f"{target_name} has digest {actual}: decoding stays lossless, but expect a low acceptance (train a head "
          f"for this target with jaxspec train-head --target {target_name})", file=sys.stderr)
    return True


def resolve_tokenizer(flag: str, name: str):
    """The tokenizer of the model ``name`` that ``flag`` gave: the ``tokenizer.json`` of its
    folder (an :class:`~jaxspec.formats.hf_tokenizer.HFTokenizer`, needs the ``tokenizers``
    package) when there is one, else the byte-level
    :class:`~jaxspec.formats.tokenizer.ByteTokenizer`. The one rule of every command that turns
    text into token ids (``generate``, ``verify``); errors are :class:`CLIError` naming
    ``flag`` and ``name``. :func:`check_tokenizer_fits` then checks it against the model."""
    from jaxspec.formats.checkpoint import load_tokenizer, resolve_model_path
    from jaxspec.formats.gguf import is_gguf_source
    from jaxspec.formats.hf_tokenizer import TOKENIZER_FILE, HFTokenizer
    from jaxspec.formats.tokenizer import ByteTokenizer

    if is_gguf_source(name):  # the tokenizer and chat template the file carries
        try:
            return load_tokenizer(name)
        except (ImportError, ValueError, OSError) as e:
            raise CLIError(f"{flag} {name}: {e}") from None
    try:
        folder = resolve_model_path(name)
    except (ValueError, FileNotFoundError) as e:
        raise CLIError(f"{flag}: {e}") from None
    if not (folder / TOKENIZER_FILE).is_file():
        return ByteTokenizer()
    try:
        return HFTokenizer.from_file(folder)
    except (ImportError, ValueError, OSError) as e:
        raise CLIError(f"{flag} {name}: {e}") from None


def check_tokenizer_fits(flag: str, name: str, tok, vocab_size: int, *, alternative: str = "") -> None:
    """Refuse a tokenizer (from :func:`resolve_tokenizer`) whose ids a model of
    ``vocab_size`` tokens cannot take: a ``tokenizer.json`` with more tokens than the model,
    or the byte tokenizer (no ``tokenizer.json``) for a vocabulary other than its own
    (:data:`~jaxspec.formats.tokenizer.VOCAB_SIZE`). ``alternative`` ends the message (``"; or
    pass ..."``)."""
    from jaxspec.formats.tokenizer import VOCAB_SIZE, ByteTokenizer

    if isinstance(tok, ByteTokenizer):
        if vocab_size != VOCAB_SIZE:
            from jaxspec.formats.hf_tokenizer import TOKENIZER_FILE

            raise CLIError(
                f"{flag} {name}: its folder has no {TOKENIZER_FILE} and its vocab_size is {vocab_size}, not the "
                f"byte tokenizer's {VOCAB_SIZE}; expected the model's {TOKENIZER_FILE} in the folder (text is "
                f"tokenized with it){alternative}"
            )
    elif tok.vocab_size > vocab_size:
        raise CLIError(
            f"{flag} {name}: its tokenizer has {tok.vocab_size} tokens but the model's vocab_size is {vocab_size}"
        )


def jax_platform_failure(e: BaseException) -> str | None:
    """The line for an exception raised while JAX started the backends ``JAX_PLATFORMS``
    names (jax 0.10 raises a bare ``AssertionError`` for ``cuda`` on a machine without a
    GPU), naming the variable and the platforms that do start here; None for any other
    exception: where JAX's backends start now, the exception was not theirs (JAX filters its
    own frames out of tracebacks, so the frames cannot tell). The platforms are found by a
    separate Python process without the variable, so that this process's JAX is left as it was."""
    import subprocess
    import sys

    wanted = os.environ.get("JAX_PLATFORMS", "").strip()
    if not wanted or "jax" not in sys.modules:
        return None
    try:
        sys.modules["jax"].devices()
        return None  # the backends start: another failure
    except Exception:  # noqa: BLE001 - whatever JAX raises for a platform it cannot start
        pass
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    probe = ("import jax\n"
             "ok = []\n"
             "for p in ('cpu', 'cuda', 'rocm', 'tpu'):\n"
             "    try:\n"
             "        jax.devices(p); ok.append(p)\n"
             "    except Exception:\n"
             "        pass\n"
             "print(','.join(ok))\n")
    try:
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        found = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        found = ""
    where = f"the platforms available here: {found.replace(',', ', ')}" if found else \
        "no platform could be listed here"
    why = str(e).strip().splitlines()
    why = f" ({why[0]})" if why else ""  # jax's bare AssertionError says nothing
    return (f"JAX_PLATFORMS={wanted}: JAX could not start {wanted}{why}; {where}; expected JAX_PLATFORMS "
            "set to one of them, or unset")
