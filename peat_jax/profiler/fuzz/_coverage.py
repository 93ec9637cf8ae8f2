"""What a fuzz budget covered of its plan, per family.

A variant's name says the lengths it sets (``len=4097``,
``len=135,rest=1``, ``draw=2(batch=3,len=129)``). Per family,
:func:`coverage` counts, of the plan and of what ran:

* **residue classes**: ``(axis, length mod 128)``;
* **magnitude bands**: ``(axis, band)``, the bands cut at
  :data:`BAND_EDGES`, and which of the :data:`LARGE` edges any length
  passed;
* **element-count residues**: of the variants run, how many residues the
  first input's element count took modulo each of :data:`MODULI`.

A class is the kernel's, over all its sites: a length of an axis reached
at one site is reached (a shape-gated path depends on the lengths, not on
which layer called the kernel), so sites of one kernel start at different
lengths (``_lattice.interleave``'s ``turn``). :func:`shape_key` says which
sites make the same call.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple, Sequence

import jax
import numpy as np

#: A length is in band i when it is at most BAND_EDGES[i] (the last band:
#: past 65,536).
BAND_EDGES = (8, 128, 1024, 4096, 32768, 65536)
#: The edges a budget should pass early (a block of 1,024 threads or
#: elements, of 4,096, a 2^15 and a 2^16 index).
LARGE = (1024, 4096, 32768, 65536)
#: Modulos of the element-count residues.
MODULI = (8, 16, 32, 128)
#: The residue classes' modulus.
RESIDUE = 128
#: Name parts that are not axis lengths.
NOT_AXES = frozenset({"rest", "draw", "scale", "packed"})
_PAIR = re.compile(r"([A-Za-z_]+[0-9]*)=([0-9]+)")


class FamilyCoverage(NamedTuple):
  """One family's coverage.

  Attributes:
    planned: variants planned.
    ran: variants run (shrunk ones not counted).
    residues: ``(reached, planned)`` residue classes.
    bands: ``(reached, planned)`` magnitude bands.
    large: the :data:`LARGE` edges some run length passed.
    element_residues: ``{modulus: residues taken}`` of the element counts.
  """

  planned: int
  ran: int
  residues: tuple[int, int]
  bands: tuple[int, int]
  large: tuple[int, ...]
  element_residues: dict


def band(n: int) -> int:
  """The magnitude band of a length (0: at most 8 ... 6: past 65,536)."""
  return next((i for i, e in enumerate(BAND_EDGES) if n <= e),
              len(BAND_EDGES))


def lengths(name: str) -> list[tuple[str, int]]:
  """The ``(axis, length)`` pairs a variant's name sets (none for a
  shrunk one)."""
  if name.startswith("min:"):
    return []
  return [(a, int(n)) for a, n in _PAIR.findall(name) if a not in NOT_AXES]


def shape_key(t) -> tuple:
  """What makes two fuzz targets the same call to a kernel: its kind,
  input shapes and dtypes, and its static parameters."""
  params = {k: v for k, v in t.base.kwargs.items()
            if not isinstance(v, (np.ndarray, jax.Array))}
  return (t.site.kernel, t.site.composite,
          tuple(tuple(np.shape(x)) for x in t.base.args),
          tuple(str(np.asarray(x).dtype) for x in t.base.args
                if isinstance(x, np.ndarray)),
          repr(sorted(params.items(), key=lambda kv: kv[0])))


class _Tally:

  def __init__(self):
    self.planned = self.ran = 0
    self.res, self.res_run = set(), set()
    self.bands, self.bands_run = set(), set()
    self.large: set = set()
    self.elems: set = set()

  def plan(self, name: str) -> None:
    self.planned += 1
    for a, n in lengths(name):
      self.res.add((a, n % RESIDUE))
      self.bands.add((a, band(n)))

  def run(self, name: str, shapes) -> None:
    self.ran += 1
    for a, n in lengths(name):
      self.res_run.add((a, n % RESIDUE))
      self.bands_run.add((a, band(n)))
      self.large |= {e for e in LARGE if n > e}
    if shapes:
      self.elems.add(math.prod(shapes[0]))

  def result(self) -> FamilyCoverage:
    best = {m: len({c % m for c in self.elems}) for m in MODULI}
    return FamilyCoverage(
        self.planned, self.ran, (len(self.res_run & self.res), len(self.res)),
        (len(self.bands_run & self.bands), len(self.bands)),
        tuple(sorted(self.large)), best)


def coverage(targets: Sequence, ran: Sequence[dict]
             ) -> dict[str, FamilyCoverage]:
  """Per family, what ``ran`` (fuzz records and findings) covered of the
  targets' plans (module docstring)."""
  names = {t.site.name for t in targets}
  fam: dict[str, _Tally] = {}
  for t in targets:
    for p in t.plans:
      fam.setdefault(p.family, _Tally()).plan(p.name)
  for r in ran:
    f = fam.get(r.get("family"))
    name = r.get("variant", "")
    if f is None or r.get("site") not in names or name.startswith("min:"):
      continue
    f.run(name, r.get("shapes"))
  return {name: f.result() for name, f in fam.items()}


def coverage_line(cov: dict[str, FamilyCoverage]) -> str:
  """One line: per family run/planned, the residue classes and bands
  reached, the large edges passed."""
  parts = []
  for name, c in cov.items():
    text = f"{name} {c.ran}/{c.planned}"
    if c.residues[1]:
      text += (f" ({c.residues[0]}/{c.residues[1]} residues, "
               f"{c.bands[0]}/{c.bands[1]} bands"
               + (f", past {max(c.large)}" if c.large else "") + ")")
    parts.append(text)
  return "coverage: " + "; ".join(parts)
