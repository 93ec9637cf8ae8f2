"""Which FFI platform a user's shared library can serve, from its ELF file.

XLA hands a handler the buffers of the platform it is registered for: a
CPU handler registered for CUDA dereferences device pointers as host
memory and takes the process down (a segmentation fault, no Python error).
Before a user's library is registered for a GPU platform its file is read
for evidence of that platform's code: a device fat binary (``.nv_fatbin``,
``.nvFatBinSegment``, ``.hip_fatbin``: what nvcc and hipcc put in every
object with device code) or a needed library of the platform's runtime
(``libcudart``, ``libcublas``, ``libamdhip64``, ``librocblas``...: a handler
that only calls a vendor library launches no kernel of its own).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

#: Section names of device code, by FFI platform.
_SECTIONS = {
    "CUDA": (".nv_fatbin", ".nvFatBinSegment"),
    "ROCM": (".hip_fatbin", ".hipFatBinSegment"),
}
#: Prefixes of needed runtime libraries, by FFI platform.
_NEEDED = {
    "CUDA": ("libcuda.", "libcudart", "libcublas", "libcudnn", "libcufft",
             "libcusolver", "libcusparse", "libcurand", "libnccl", "libnvrtc"),
    "ROCM": ("libamdhip64", "libhiprtc", "librocblas", "libhipblas",
             "libmiopen", "librccl", "libhipfft", "librocfft"),
}
_DT_NEEDED = 1
_SHT_DYNAMIC = 6


class LibraryCode(NamedTuple):
  """What a shared library's file shows about its code.

  Attributes:
    sections: its section names.
    needed: the libraries it needs (``DT_NEEDED``).
  """

  sections: tuple[str, ...]
  needed: tuple[str, ...]

  def serves(self, platform: str) -> bool:
    """Whether it holds code for the FFI ``platform`` (``"cpu"`` always:
    any library's host code runs there)."""
    if platform == "cpu":
      return True
    return (any(s in self.sections for s in _SECTIONS.get(platform, ()))
            or any(n.startswith(p) for n in self.needed
                   for p in _NEEDED.get(platform, ())))


def _cstr(table: bytes, offset: int) -> str:
  end = table.find(b"\0", offset)
  return table[offset:end if end >= 0 else len(table)].decode(
      "latin-1")


def library_code(path: str) -> LibraryCode:
  """Reads a 64-bit little-endian ELF shared library's section names and
  needed libraries.

  Args:
    path: the library's file.

  Returns:
    Its :class:`LibraryCode`.

  Raises:
    ValueError: the file is not a 64-bit little-endian ELF file or is cut
      short.
  """
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b"\x7fELF" or len(data) < 64:
    raise ValueError(f"{path} is not an ELF file")
  if data[4] != 2 or data[5] != 1:
    raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  if shoff == 0 or shnum == 0:
    return LibraryCode((), ())
  if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
    raise ValueError(f"{path}: its section headers lie beyond the file")
  heads = []
  for i in range(shnum):
    # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link
    heads.append(struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize))
  _, _, _, _, stroff, strsize, _ = heads[shstrndx]
  names_table = data[stroff:stroff + strsize]
  sections = tuple(_cstr(names_table, h[0]) for h in heads)
  needed = []
  for _, kind, _, _, off, size, link in heads:
    if kind != _SHT_DYNAMIC or link >= shnum:
      continue
    _, _, _, _, dstr_off, dstr_size, _ = heads[link]
    dynstr = data[dstr_off:dstr_off + dstr_size]
    for at in range(off, min(off + size, len(data)) - 15, 16):
      tag, value = struct.unpack_from("<qQ", data, at)
      if tag == 0:
        break
      if tag == _DT_NEEDED:
        needed.append(_cstr(dynstr, value))
  return LibraryCode(sections, tuple(needed))
