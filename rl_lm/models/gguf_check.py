"""A GGUF file's header, read within bounds: every declared count and size is checked against the file before
anything is allocated for it.

A GGUF file is untrusted input, and its header declares sizes that a reader believes: gguf's own
`GGUFReader` loops once per declared array element (a 49-byte file declaring 2^62 of them grows without
end), keeps a numpy view per string (hundreds of bytes of Python objects per byte of file), and maps
tensors wherever their offsets point, so 200 tensors can share one block of data and ask for 200 times
its size. `read_header` walks the same layout itself, in one pass, refusing on the first thing that does
not fit:

  magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64         (little-endian only)
  kv_count x     key: string | value type u32 | value
                 string = length u64 + UTF-8 bytes; array = item type u32 + count u64 + items
  tensor_count x name: string | n_dims u32 | dims u64 x n_dims (fastest first) | ggml type u32 | offset u64
  padding to general.alignment (default 32), then the tensor data; offsets count from there

Checks: the magic and version; counts against the bytes left (each key/value takes at least 13 bytes,
each tensor 32, each array item its type's size) and against absolute caps (`Caps`); string lengths
against the bytes left; keys and tensor names unique and UTF-8; the alignment a power of two; tensors of
1-4 dimensions of known ggml types whose first dimension is a whole number of the type's blocks, each
aligned, inside the file and overlapping no other. Tensor data is then read as numpy views of the file
(`tensor_bytes`), in the byte layout `gguf.quants.dequantize` takes: llama.cpp's library still does all
the decoding. `check_tokenizer` checks the vocabulary metadata the converter builds a tokenizer from.
Every problem is a `GGUFError` whose message is one line (the converter adds the file's name).
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
_HEADER = struct.Struct("<4sIQQ")
_MIN_KV_BYTES = 8 + 4 + 1  # an empty key, a type, a one-byte value
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # an empty name, n_dims, one dimension, a type, an offset
_SCALARS = {  # GGUF value type -> (struct format, numpy dtype), little-endian
  GGUFValueType.UINT8: ("<B", "<u1"), GGUFValueType.INT8: ("<b", "<i1"), GGUFValueType.UINT16: ("<H", "<u2"),
  GGUFValueType.INT16: ("<h", "<i2"), GGUFValueType.UINT32: ("<I", "<u4"), GGUFValueType.INT32: ("<i", "<i4"),
  GGUFValueType.FLOAT32: ("<f", "<f4"), GGUFValueType.BOOL: ("<?", "<u1"), GGUFValueType.UINT64: ("<Q", "<u8"),
  GGUFValueType.INT64: ("<q", "<i8"), GGUFValueType.FLOAT64: ("<d", "<f8"),
}
_MIN_ITEM_BYTES = {**{t: struct.calcsize(f) for t, (f, _) in _SCALARS.items()},
                   GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 4 + 8}


class GGUFError(ValueError):
  """A malformed GGUF file; the message (one line) says what is wrong, without the file's name."""

  user_facing = True


@dataclasses.dataclass(frozen=True)
class Caps:
  """Absolute bounds, beyond the file's size, on what the header may declare (real checkpoints: a vocabulary
  of at most about 260k tokens and as many merges, about 1,100 tensors for a 405B model)."""

  kv_count: int = 1 << 16
  tensor_count: int = 1 << 16
  array_items: int = 1 << 22  # one array
  metadata_items: int = 1 << 23  # all array items together (each becomes a Python object)
  string_bytes: int = 1 << 24  # one string (a chat template is a few KiB)
  name_bytes: int = 1 << 10  # one key or tensor name
  array_depth: int = 3  # arrays of arrays
  dims: int = 4  # GGML_MAX_DIMS


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  dims: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
  ggml_type: GGMLQuantizationType
  offset: int  # from the start of the file
  n_bytes: int

  @property
  def shape(self) -> tuple[int, ...]:
    """numpy order (the slowest dimension first): a projection's [out, in], as Hugging Face stores it."""
    return tuple(reversed(self.dims))


@dataclasses.dataclass(frozen=True)
class Header:
  size: int  # of the file, in bytes
  version: int
  metadata: dict[str, Any]  # strings, ints, floats, bools, and lists of them
  tensors: tuple[TensorInfo, ...]  # in file order
  alignment: int
  data_offset: int


class _Cursor:
  """Reads forward through a buffer, never past its end, counting metadata items against the caps."""

  def __init__(self, buf: Any, caps: Caps):
    self.buf, self.caps, self.pos, self.items = buf, caps, 0, 0

  def need(self, n: int, what: str) -> None:
    if n > len(self.buf) - self.pos:
      raise GGUFError(f"{what} needs {n} bytes at offset {self.pos}, but the file ends after {len(self.buf)}")

  def unpack(self, fmt: str, what: str) -> Any:
    size = struct.calcsize(fmt)
    self.need(size, what)
    (value,) = struct.unpack_from(fmt, self.buf, self.pos)
    self.pos += size
    return value

  def string(self, what: str, cap: int) -> str:
    n = self.unpack("<Q", f"the length of {what}")
    if n > cap:
      raise GGUFError(f"{what} declares {n} bytes; the limit is {cap}")
    self.need(n, what)
    try:
      text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
    except UnicodeDecodeError as e:
      raise GGUFError(f"{what} is not UTF-8 ({e.reason} at byte {e.start})") from None
    self.pos += n
    return text

  def value(self, kind: int, what: str, depth: int = 0) -> Any:
    if kind == GGUFValueType.STRING:
      return self.string(what, self.caps.string_bytes)
    if kind in _SCALARS:
      return self.unpack(_SCALARS[kind][0], what)
    if kind != GGUFValueType.ARRAY:
      raise GGUFError(f"{what} has unknown value type {kind}")
    if depth >= self.caps.array_depth:
      raise GGUFError(f"{what} nests arrays deeper than {self.caps.array_depth}")
    item = self.unpack("<I", f"the item type of {what}")
    count = self.unpack("<Q", f"the length of {what}")
    if item not in _MIN_ITEM_BYTES:
      raise GGUFError(f"{what} is an array of unknown value type {item}")
    if count > self.caps.array_items:
      raise GGUFError(f"{what} declares {count} items; the limit is {self.caps.array_items}")
    self.need(count * _MIN_ITEM_BYTES[item], f"{what} ({count} items)")
    self.items += count
    if self.items > self.caps.metadata_items:
      raise GGUFError(f"the metadata declares more than {self.caps.metadata_items} array items in all")
    if item in _SCALARS:  # one numpy read, not a loop per item (from a copy: no view may outlive the map)
      end = self.pos + count * _MIN_ITEM_BYTES[item]
      values = np.frombuffer(self.buf[self.pos:end], _SCALARS[item][1])
      self.pos = end
      return (values != 0).tolist() if item == GGUFValueType.BOOL else values.tolist()
    return [self.value(item, f"{what}[{i}]", depth + 1) for i in range(count)]


def read_header(path: str | os.PathLike, caps: Caps = Caps()) -> Header:
  """The metadata and tensor table of the GGUF file at `path`, checked (see the module docstring)."""
  size = os.path.getsize(path)
  if size < _HEADER.size:
    raise GGUFError(f"{size} bytes is too short for a GGUF header ({_HEADER.size})")
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
      raise GGUFError(f"not a GGUF file (magic {magic!r}, expected {MAGIC!r})")
    if version not in VERSIONS:
      swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
      if swapped in VERSIONS:
        raise GGUFError("a big-endian GGUF file; only little-endian files convert")
      raise GGUFError(f"GGUF version {version} is not supported (only {' and '.join(map(str, VERSIONS))})")
    if n_kv > caps.kv_count or n_tensors > caps.tensor_count:
      raise GGUFError(f"declares {n_kv} metadata keys and {n_tensors} tensors; the limits are {caps.kv_count} "
                      f"and {caps.tensor_count}")
    need = _HEADER.size + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES
    if need > size:
      raise GGUFError(f"declares {n_kv} metadata keys and {n_tensors} tensors, which need at least {need} bytes; "
                      f"the file has {size}")
    cur = _Cursor(buf, caps)
    cur.pos = _HEADER.size
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
      key = cur.string(f"metadata key {i}", caps.name_bytes)
      if key in metadata:
        raise GGUFError(f"metadata key {key!r} appears twice")
      metadata[key] = cur.value(cur.unpack("<I", f"the value type of {key!r}"), f"metadata {key!r}")
    alignment = _alignment(metadata)
    infos = [_tensor_info(cur, i, caps) for i in range(n_tensors)]
  data_offset = -(-cur.pos // alignment) * alignment
  return Header(size, version, metadata, _place(infos, data_offset, alignment, size), alignment, data_offset)


def _alignment(metadata: dict[str, Any]) -> int:
  alignment = metadata.get("general.alignment", 32)
  if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
    raise GGUFError(f"general.alignment is {alignment!r}; it must be a power of two")
  return alignment


def _tensor_info(cur: _Cursor, i: int, caps: Caps) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
  """(name, dims, type, offset from the data section, bytes) of tensor `i`, its own fields checked."""
  name = cur.string(f"the name of tensor {i}", caps.name_bytes)
  n_dims = cur.unpack("<I", f"the rank of tensor {name!r}")
  if not 1 <= n_dims <= caps.dims:
    raise GGUFError(f"tensor {name!r} has {n_dims} dimensions (1 to {caps.dims} allowed)")
  dims = tuple(cur.unpack("<Q", f"the dimensions of tensor {name!r}") for _ in range(n_dims))
  kind = cur.unpack("<I", f"the type of tensor {name!r}")
  offset = cur.unpack("<Q", f"the offset of tensor {name!r}")
  try:
    ggml_type = GGMLQuantizationType(kind)
    block, type_size = GGML_QUANT_SIZES[ggml_type]
  except (ValueError, KeyError):
    raise GGUFError(f"tensor {name!r} has unknown ggml type {kind}") from None
  if min(dims) < 1:
    raise GGUFError(f"tensor {name!r} has a dimension of 0 ({list(dims)})")
  if dims[0] % block:
    raise GGUFError(f"tensor {name!r}: its rows of {dims[0]} elements are not whole {ggml_type.name} blocks of {block}")
  n_bytes = math.prod(dims) // block * type_size
  if n_bytes > len(cur.buf):
    raise GGUFError(f"tensor {name!r} of dimensions {list(dims)} ({ggml_type.name}) needs {n_bytes} bytes; the file "
                    f"has {len(cur.buf)}")
  return name, dims, ggml_type, offset, n_bytes


def _place(infos: list[tuple], data_offset: int, alignment: int, size: int) -> tuple[TensorInfo, ...]:
  """The tensors, each aligned, inside the file, no two sharing a byte and no two of one name."""
  tensors, names = [], set()
  for name, dims, ggml_type, offset, n_bytes in infos:
    if name in names:
      raise GGUFError(f"tensor {name!r} appears twice")
    names.add(name)
    if offset % alignment:
      raise GGUFError(f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment {alignment}")
    if data_offset + offset + n_bytes > size:
      raise GGUFError(f"tensor {name!r} ends at byte {data_offset + offset + n_bytes}, past the end of the file "
                      f"({size} bytes)")
    tensors.append(TensorInfo(name, dims, ggml_type, data_offset + offset, n_bytes))
  by_start = sorted(tensors, key=lambda t: t.offset)
  for a, b in zip(by_start, by_start[1:], strict=False):
    if a.offset + a.n_bytes > b.offset:
      raise GGUFError(f"tensors {a.name!r} and {b.name!r} overlap (bytes {b.offset} to "
                      f"{min(a.offset + a.n_bytes, b.offset + b.n_bytes)} of the file)")
  return tuple(tensors)


def tensor_bytes(data: np.ndarray, t: TensorInfo) -> np.ndarray:
  """The bytes of tensor `t` from `data` (the whole file as uint8, e.g. a np.memmap), shaped as
  `gguf.quants.dequantize` takes them: numpy order, the last axis a row's bytes."""
  block, type_size = GGML_QUANT_SIZES[t.ggml_type]
  return data[t.offset:t.offset + t.n_bytes].reshape(*t.shape[:-1], t.shape[-1] // block * type_size)


def check_tokenizer(meta: dict[str, Any]) -> None:
  """The vocabulary metadata the converter uses: tokens, their types, the special token ids, the merges."""
  tokens = meta.get("tokenizer.ggml.tokens")
  if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
    raise GGUFError("tokenizer.ggml.tokens must be a non-empty array of strings")
  types = meta.get("tokenizer.ggml.token_type")
  if types is not None:
    if not isinstance(types, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
      raise GGUFError("tokenizer.ggml.token_type must be an array of integers")
    if len(types) != len(tokens):
      raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
  for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokens)):
      raise GGUFError(f"tokenizer.ggml.{key} is {value!r}, not a token id (0 to {len(tokens) - 1})")
  merges = meta.get("tokenizer.ggml.merges")
  if meta.get("tokenizer.ggml.model") == "gpt2" and merges is None:
    raise GGUFError("tokenizer.ggml.merges is missing; a byte-level BPE vocabulary needs it")
  if merges is not None:
    if not isinstance(merges, list):
      raise GGUFError("tokenizer.ggml.merges must be an array of strings")
    vocab = set(tokens)
    for i, merge in enumerate(merges):
      parts = merge.split(" ", 1) if isinstance(merge, str) else []
      if len(parts) != 2 or not all(parts):
        raise GGUFError(f"tokenizer.ggml.merges[{i}] is {merge!r}, not two tokens separated by one space")
      for token in (*parts, "".join(parts)):
        if token not in vocab:
          raise GGUFError(f"tokenizer.ggml.merges[{i}] ({merge!r}) names {token!r}, which is not a token")
  for key in ("tokenizer.chat_template", "tokenizer.ggml.model"):
    if key in meta and not isinstance(meta[key], str):
      raise GGUFError(f"{key} must be a string")
  for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
    if key in meta and not isinstance(meta[key], bool):
      raise GGUFError(f"{key} must be a boolean")
