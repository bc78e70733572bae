"""Chief-only checkpointing: save every N global steps, restore on restart.

Only the chief reads or writes checkpoints; the other workers receive the
restored values through the initial-state broadcast (server variables exist
once), so a shared filesystem is not needed.

Checkpoints are TensorFlow's standard V2 format keyed by variable name, the
keys tf.compat.v1.train.Saver uses, written with the SaveV2/RestoreV2 ops
directly: a variable split into row partitions on servers is saved whole under
its original name, so single-device and distributed jobs load each other's
checkpoints.

A save is atomic: SaveV2 writes into a temporary directory next to the
checkpoints (it writes each file as ``<name>.tempstate<random>`` and renames
it when complete), the finished files are renamed into place and only then
does the ``checkpoint`` state file (itself replaced atomically) list the new
checkpoint. A save killed half-way leaves temporary files that the next
restore or save removes, never a listed checkpoint with missing parts; a save
that fails (a full disk) raises AutoparError saying so and leaves the state
file, and with it the previous checkpoint, as it was. The newest ``keep``
checkpoints are kept. Restoring tries the newest listed checkpoint first; one
that is truncated, has a missing or empty file or fails TensorFlow's
per-tensor CRC32C check (whatever error TensorFlow raises reading it) is
reported by name, with the file that is missing or empty, and the previous
one is tried, then those the state file does not list (the damaged ones are
deleted once one restores). One whose variables are not this graph's (names,
shapes, dtypes) is refused, never deleted.

The directory is the only place read or written. The state file names
checkpoints relative to it (as ``Saver(save_relative_paths=True)`` does), so
a copied or moved directory keeps working; an absolute path in a state file
written elsewhere (by an older autopar, or TensorFlow's own functions) is
used only if it names a checkpoint in this directory, or, for a directory
that was moved or copied, by its file name if that checkpoint is here.
Anything else it lists is ignored with a warning: a crafted state file cannot
make a job read or delete files outside checkpoint_dir, and only a
checkpoint's own files (``NAME.index``, ``NAME.data-*-of-*``) are ever deleted.
"""
from __future__ import annotations

import errno
import glob
import logging
import os
import re
import shutil
import tempfile

import tensorflow as tf
from google.protobuf import text_format

from autopar.common.errors import AutoparError, shown
from autopar.runtime.console import op_error_text
from autopar.runtime.outputs import writable_directory
from autopar.transforms.partition import PartitionedVariable

tf1 = tf.compat.v1
log = logging.getLogger("autopar.checkpoint")

STATE_FILE = "checkpoint"          # TensorFlow's name for the state file
_MAX_STATE_BYTES = 1 << 20         # a state file lists a few names; more is not one
# TensorFlow's CheckpointState message, reached through public API
# (the proto module itself is private).
_CheckpointState = type(tf1.train.generate_checkpoint_state_proto(
    "/", "x", all_model_checkpoint_paths=["x"]))
# Temporary directories of saves in progress (or killed), inside the checkpoint directory.
_TEMP_DIR_PREFIX = ".autopar-saving-"
# A damaged checkpoint raises any tf.errors.OpError on restore: a truncated
# file OutOfRange (DataLoss for a truncated index), a flipped bit DataLoss
# (CRC32C mismatch), a missing .data or .index file NotFound, an empty or
# garbled index the base OpError ("file is too short to be an sstable").
_DATA_SHARD = re.compile(r"\.data-\d{5}-of-\d{5}")


class Checkpointer:
    def __init__(self, graph: tf.Graph, directory: str, every_steps: int,
                 partitions: dict[str, PartitionedVariable] | None = None,
                 keep: int = 5):
        self.directory = directory
        self._root = os.path.abspath(directory)
        self.every_steps = every_steps
        self.keep = keep
        self.prefix = os.path.join(directory, "model.ckpt")
        self.last_saved: int | None = None
        self._noted: set[str] = set()      # state-file entries already warned about
        partitions = partitions or {}
        with graph.as_default(), tf.name_scope("autopar/checkpoint"):
            self._path = tf1.placeholder(tf.string, [], name="path")
            variables = sorted(graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES),
                               key=lambda v: v.op.name)
            names = [v.op.name for v in variables]
            # What a checkpoint must hold to be this graph's (checked before restoring).
            self._expected = {v.op.name: (v.shape, v.dtype.base_dtype) for v in variables}
            values, restores = [], []
            restored = tf.raw_ops.RestoreV2(prefix=self._path, tensor_names=names,
                                            shape_and_slices=[""] * len(names),
                                            dtypes=[v.dtype.base_dtype for v in variables])
            for v, value in zip(variables, restored):
                parts = partitions.get(v.op.name)
                if not parts:
                    # Reads and writes live with the variable (maybe on a server).
                    with tf.device(v.op.device):
                        values.append(v.value())
                        restores.append(v.assign(tf.reshape(value, v.shape)).op)
                    continue
                pieces = []
                for p, part in enumerate(parts.handles):
                    handle = graph.get_operation_by_name(part).outputs[0]
                    with tf.device(handle.op.device):
                        pieces.append(tf.raw_ops.ReadVariableOp(resource=handle,
                                                                dtype=v.dtype.base_dtype))
                        restores.append(tf.raw_ops.AssignVariableOp(
                            resource=handle, value=parts.layout.piece(value, p)))
                values.append(parts.layout.whole(pieces))
            self._save = tf.raw_ops.SaveV2(prefix=self._path, tensor_names=names,
                                           shape_and_slices=[""] * len(names), tensors=values)
            self._restore = tf.group(*restores)

    def restore(self, session) -> int | None:
        """Restore the newest intact checkpoint if there is one; its step, else None.

        First checks that checkpoints can be written at all (an unwritable
        directory is an AutoparError before any training). The listed
        checkpoints are tried newest first, then, if every one is damaged,
        those the state file does not list. Damaged checkpoints newer than
        the restored one are reported (what is damaged, TensorFlow's words),
        then deleted and dropped from the state file, and the one used is
        named; if every checkpoint is damaged this raises AutoparError
        (deleting nothing) rather than silently starting from initial values.
        """
        self._check_writable()
        self._remove_temporaries()
        candidates = self._checkpoints()
        if not candidates:
            log.info("no checkpoint in %s: starting from initial values", self.directory)
            return None
        # When every listed checkpoint is damaged, those of the directory the
        # state file does not list (a save killed before it listed its
        # checkpoint, an old one not deleted yet) are tried, newest first.
        unlisted = [p for p in self._index_files() if p not in candidates]
        order = [*reversed(candidates), *reversed(unlisted)]
        damaged = []
        for path in order:
            try:
                self._check_holds_variables(path)
                session.run(self._restore, {self._path: path})
            except tf.errors.OpError as exc:
                reason = _reason(exc)
                if isinstance(exc, tf.errors.NotFoundError) and not _files_missing(path):
                    # Intact files without this graph's variables: another model's
                    # checkpoint, not damage. Never delete it.
                    raise AutoparError(
                        f"checkpoint {path} does not hold this graph's variables ({reason}). "
                        "Point checkpoint_dir at a directory of this model's checkpoints "
                        "or an empty one.") from exc
                damage = _damaged_files(path)
                log.warning("checkpoint %s is corrupt or incomplete (%s: %s%s)%s", path,
                            type(exc).__name__, reason, f"; {damage}" if damage else "",
                            "; trying the previous one" if path != order[-1] else "")
                damaged.append(path)
                continue
            step = _step_of(path)
            if damaged:
                for bad in damaged:
                    self._delete(bad)
                kept = sorted({*(p for p in candidates if p not in damaged), path}, key=_step_of)
                self._write_state(kept)
                log.warning("deleted the damaged checkpoint(s) %s; resuming from %s (global "
                            "step %d)%s", ", ".join(os.path.basename(p) for p in damaged),
                            os.path.basename(path), step,
                            ", which the state file did not list" if path in unlisted else "")
            self.last_saved = step
            log.info("restored %s (global step %d)", path, step)
            return step
        raise AutoparError(
            f"every checkpoint in {self.directory} is corrupt or incomplete "
            f"({', '.join(os.path.basename(p) for p in damaged)}; see the messages above; "
            "none was deleted). Move the directory away to start from initial values, or "
            "restore it from a backup.")

    def maybe_save(self, session, step: int) -> None:
        if step % self.every_steps == 0 and step != self.last_saved:
            self.save(session, step)

    def save(self, session, step: int) -> str:
        """Write the checkpoint of ``step`` atomically; its path. A save that
        fails (full disk, unwritable directory) raises AutoparError and
        leaves the previous checkpoints and the state file as they were."""
        path = f"{self.prefix}-{step}"
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._remove_temporaries()
            temp_dir = tempfile.mkdtemp(prefix=_TEMP_DIR_PREFIX, dir=self.directory)
            try:
                session.run(self._save,
                            {self._path: os.path.join(temp_dir, os.path.basename(path))})
                # The index last: a checkpoint is found by its index file.
                for name in sorted(os.listdir(temp_dir), key=lambda n: n.endswith(".index")):
                    os.replace(os.path.join(temp_dir, name), os.path.join(self.directory, name))
            finally:
                shutil.rmtree(temp_dir, ignore_errors=True)
            kept = [p for p in self._checkpoints() if p != path]
            kept.append(path)
            # State first: a kill in between leaves unlisted files, not listed missing ones.
            self._write_state(kept[-self.keep:])
        except (OSError, tf.errors.OpError) as exc:
            raise AutoparError(self._save_failure(path, step, exc)) from exc
        for old in kept[:-self.keep]:
            self._delete(old)
        self.last_saved = step
        log.info("saved checkpoint %s", path)
        return path

    def _save_failure(self, path: str, step: int, exc: Exception) -> str:
        if isinstance(exc, OSError):
            what = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        else:
            what = f"{type(exc).__name__}: {_reason(exc)}"
        full = ((isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))
                or "No space left on device" in str(exc))
        if full:
            what = f"no space left on device in {self.directory}"
        try:
            previous = [os.path.basename(p) for p in self._checkpoints()]
        except AutoparError:
            previous = []
        kept = (f"the previous checkpoint {previous[-1]} is kept" if previous
                else "no earlier checkpoint exists")
        todo = ("free space on that disk or point Config(checkpoint_dir=...) at another one"
                if full else "check the directory, or point Config(checkpoint_dir=...) elsewhere")
        return (f"could not save checkpoint {path} at global step {step}: {what}; {kept}. "
                f"To resume, {todo}.")

    def _check_writable(self) -> None:
        """Refuse, before any training, a checkpoint_dir nothing can be saved in."""
        writable_directory(self.directory, "checkpoint_dir")

    def _check_holds_variables(self, path: str) -> None:
        """AutoparError unless checkpoint ``path`` has every variable of this
        graph with its shape and dtype (its index only; damage to the index
        raises as restoring would)."""
        try:
            reader = tf.train.load_checkpoint(path)
            shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
        except tf.errors.OpError:
            raise
        except Exception as exc:   # noqa: BLE001 - whatever else TensorFlow's reader raises
            raise tf.errors.DataLossError(None, None, f"its index cannot be read "
                                                      f"({type(exc).__name__}: {exc})") from exc
        for name, (shape, dtype) in self._expected.items():
            if name not in shapes:
                problem = f"it has no variable '{name}'"
            elif shape.is_fully_defined() and shape.as_list() != list(shapes[name]):
                problem = (f"'{name}' has shape {list(shapes[name])} there, {shape.as_list()} "
                           "in this graph")
            elif dtypes[name].base_dtype != dtype:
                problem = f"'{name}' is {dtypes[name].name} there, {dtype.name} in this graph"
            else:
                continue
            raise AutoparError(
                f"checkpoint {path} does not hold this graph's variables ({problem}). Point "
                "checkpoint_dir at a directory of this model's checkpoints or an empty one.")

    # -- the state file ----------------------------------------------------------
    def _checkpoints(self) -> list[str]:
        """Checkpoint paths in the directory, oldest first: those the state
        file lists, or, with no state file (a save killed before writing it)
        or none it lists in this directory, every index file."""
        names = self._read_state()
        if names:
            return [os.path.join(self.directory, n) for n in names]
        return self._index_files()

    def _index_files(self) -> list[str]:
        """Every checkpoint of this prefix in the directory (by its index
        file), oldest first, listed or not."""
        found = [p[:-len(".index")] for p in glob.glob(glob.escape(self.prefix) + "-*.index")]
        return sorted((p for p in found if re.fullmatch(r"\d+", p.rsplit("-", 1)[-1])),
                      key=_step_of)

    def _read_state(self) -> list[str]:
        """The file names (in the directory) of the checkpoints the state file
        lists, oldest first; [] without a state file."""
        state_path = os.path.join(self.directory, STATE_FILE)
        try:
            with open(state_path, "rb") as f:
                raw = f.read(_MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise AutoparError(f"cannot read the checkpoint state file {state_path} "
                               f"({exc.strerror or exc})") from exc
        state = _CheckpointState()
        try:
            if len(raw) > _MAX_STATE_BYTES:
                raise ValueError(f"larger than {_MAX_STATE_BYTES} bytes")
            text_format.Parse(raw.decode("utf-8"), state)
        except (UnicodeDecodeError, text_format.ParseError, ValueError) as exc:
            raise AutoparError(
                f"{state_path} is not a TensorFlow checkpoint state file "
                f"({shown(str(exc), 120)}), and saving would overwrite it. Point checkpoint_dir "
                "at a directory of this model's checkpoints or an empty one, or remove that "
                "file.") from exc
        listed = list(state.all_model_checkpoint_paths)
        if state.model_checkpoint_path and state.model_checkpoint_path not in listed:
            listed.append(state.model_checkpoint_path)
        names: list[str] = []
        for entry in listed:
            name = self._local_name(entry, state_path)
            if name is not None and name not in names:
                names.append(name)
        return names

    def _local_name(self, entry: str, state_path: str) -> str | None:
        """The file name in this directory of a checkpoint the state file
        lists, or None (warned once) if it names none here."""
        path = os.path.normpath(entry if os.path.isabs(entry) else os.path.join(self._root, entry))
        name = os.path.basename(path)
        here = {self._root, os.path.realpath(self._root)}
        if name and not name.startswith("."):
            if os.path.dirname(path) in here:
                return name
            if os.path.isabs(entry) and os.path.exists(os.path.join(self._root, name + ".index")):
                if entry not in self._noted:
                    self._noted.add(entry)
                    log.info("%s lists %s, outside %s (the directory was moved or copied): "
                             "using %s there", state_path, shown(entry, 200), self.directory,
                             name)
                return name
        if entry not in self._noted:
            self._noted.add(entry)
            log.warning("ignoring %s listed in %s: it is not a checkpoint in checkpoint_dir, and "
                        "autopar reads and deletes only files there", shown(entry, 200),
                        state_path)
        return None

    def _write_state(self, paths: list[str]) -> None:
        """List ``paths`` (in the directory; the last is the newest) in the
        state file by name, replacing it atomically."""
        names = [os.path.basename(p) for p in paths]
        state = tf1.train.generate_checkpoint_state_proto(self._root, names[-1],
                                                          all_model_checkpoint_paths=names)
        fd, temp = tempfile.mkstemp(prefix=_TEMP_DIR_PREFIX, dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text_format.MessageToString(state))
            os.replace(temp, os.path.join(self.directory, STATE_FILE))
        except BaseException:
            try:
                os.remove(temp)
            except FileNotFoundError:
                pass
            raise

    def _delete(self, path: str) -> None:
        """Delete the files of checkpoint ``path`` (its index and data shards),
        which must be in the directory: nothing else is ever deleted."""
        if os.path.dirname(os.path.abspath(path)) != self._root:
            log.warning("not deleting %s: it is outside %s", path, self.directory)
            return
        prefix = os.path.basename(path)
        for name in os.listdir(self._root):
            rest = name[len(prefix):] if name.startswith(prefix) else None
            if rest == ".index" or (rest is not None and _DATA_SHARD.fullmatch(rest)):
                try:
                    os.remove(os.path.join(self._root, name))
                except FileNotFoundError:
                    pass

    def _remove_temporaries(self) -> None:
        """Remove what killed saves left: temporary directories and TensorFlow's
        ``*.tempstate*`` files (which can be as large as the model)."""
        leftovers = (glob.glob(os.path.join(glob.escape(self.directory), _TEMP_DIR_PREFIX + "*"))
                     + glob.glob(os.path.join(glob.escape(self.directory), "*.tempstate*")))
        for path in leftovers:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
        if leftovers:
            log.info("removed %d temporary file(s) left by an interrupted save in %s",
                     len(leftovers), self.directory)


def _step_of(path: str) -> int:
    tail = os.path.basename(path).rsplit("-", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else 0


def _reason(exc: tf.errors.OpError) -> str:
    """The kernel's own words from a graph-mode error (runtime/console.py)."""
    return op_error_text(exc) or type(exc).__name__


def _damaged_files(path: str) -> str:
    """Which of checkpoint ``path``'s files is missing or empty ("" when
    none: the damage is inside one)."""
    index = os.path.basename(path) + ".index"
    if not os.path.exists(path + ".index"):
        return f"{index} is missing"
    if os.path.getsize(path + ".index") == 0:
        return f"{index} is empty"
    shards = glob.glob(glob.escape(path) + ".data-*-of-*")
    if not shards:
        return f"{os.path.basename(path)}.data-* is missing"
    total = int(shards[0].rsplit("-of-", 1)[1])
    for i in range(total):
        name = f"{path}.data-{i:05d}-of-{total:05d}"
        if not os.path.exists(name):
            return f"{os.path.basename(name)} is missing"
        if os.path.getsize(name) == 0:
            return f"{os.path.basename(name)} is empty"
    return ""


def _files_missing(path: str) -> bool:
    """Whether the index or any data shard of checkpoint ``path`` is missing."""
    return _damaged_files(path).endswith("is missing")
