"""Shadow memory: what the sanitizer knows about each arena element.

* :class:`InitShadow` (initcheck): one flag per buffer element, set once
  anything writes it (a kernel store, an ext op's output, the decode step's
  input buffers). It lives as long as the run: the KV cache written in an
  earlier step counts as written. Weights are always initialized.
* :class:`RaceShadow` (racecheck): per dispatch, for each element of the
  regions being tracked, up to two distinct lanes that wrote it and two that
  read it, each with the pc of its last such access. Two distinct lanes are
  enough to answer the only question asked: did a lane *other than L* write
  (or read) this element in this dispatch? Entries carry the dispatch's
  epoch, so starting a dispatch costs nothing however large the regions.
"""
from __future__ import annotations

import numpy as np

from ..model import Region
from .findings import Hazard

NONE = -1


class InitShadow:
    def __init__(self, model):
        regions = list(model.regions.values())
        buffers = [r for r in regions if r.is_buffer]
        self.span = max((r.stop for r in buffers), default=0)
        self.written = np.zeros(self.span, dtype=bool)
        for r in regions:  # the layout puts weights after buffers; be exact if not
            if not r.is_buffer and r.base < self.span:
                self.written[r.base: min(r.stop, self.span)] = True
        self._full: set[int] = set()
        for r in model.inputs.values():  # every step writes them before its first node
            self.mark_region(r)

    def copy(self) -> "InitShadow":
        other = InitShadow.__new__(InitShadow)
        other.span = self.span
        other.written = self.written.copy()
        other._full = set(self._full)
        return other

    def mark(self, addresses: np.ndarray) -> None:
        a = addresses[addresses < self.span]
        self.written[a] = True

    def mark_region(self, region: Region) -> None:
        if region.base < self.span:
            self.written[region.base: min(region.stop, self.span)] = True
            self._full.add(region.base)

    def full(self, region: Region) -> bool:
        """Every element of ``region`` has been written (stays true: nothing unwrites)."""
        if region.base in self._full or region.base >= self.span:
            return True
        if self.written[region.base: region.stop].all():
            self._full.add(region.base)
            return True
        return False

    def unwritten(self, addresses: np.ndarray) -> np.ndarray:
        """Mask of the addresses nothing has written yet."""
        if not addresses.size or addresses.max() < self.span:  # all in buffers: the usual
            return ~self.written[addresses]
        inside = addresses < self.span
        out = np.zeros(addresses.shape, dtype=bool)
        out[inside] = ~self.written[addresses[inside]]
        return out


class RaceShadow:
    """Accesses of one dispatch to the regions it tracks, element by element."""

    FIELDS = ("epoch", "w1", "w1pc", "w2", "w2pc", "r1", "r1pc", "r2", "r2pc")

    def __init__(self):
        self.epoch = 0
        self.size = 0
        self.start: dict[int, int] = {}  # region base -> where its elements start here
        for f in self.FIELDS:
            setattr(self, f"_{f}", np.zeros(0, dtype=np.int32))

    def begin(self, regions: list[Region]) -> None:
        """A new dispatch tracking ``regions``: everything recorded before is forgotten."""
        self.epoch += 1
        self.start, n = {}, 0
        for r in regions:
            self.start[r.base] = n
            n += r.size
        if n > self.size:
            grown = max(n, 2 * self.size)
            for f in self.FIELDS:
                old = getattr(self, f"_{f}")
                new = np.zeros(grown, dtype=np.int32)
                new[: old.size] = old
                setattr(self, f"_{f}", new)
            self.size = grown

    def tracks(self, region: Region) -> bool:
        return region.base in self.start

    def access(self, region: Region, addresses: np.ndarray, lanes: np.ndarray, pc: int,
               store: bool) -> list[tuple]:
        """Record one instruction's accesses (lockstep: all lanes at once) to ``region``.

        Returns the hazards they make, at most one per (kind, earlier pc), as
        (Hazard, earlier lane, earlier pc, lane, address) of the first access that
        made it; and a count of all conflicting accesses as the last item of each."""
        if addresses.size == 0:
            return []
        c = (addresses - region.base + self.start[region.base]).astype(np.int64)
        lanes = lanes.astype(np.int32)
        self._fresh(c)
        found = []
        w = self._other(self._w1, self._w1pc, self._w2, self._w2pc, c, lanes)
        found += self._hazards(Hazard.WAW if store else Hazard.RAW, w, c, lanes, pc,
                               addresses)
        if store:
            r = self._other(self._r1, self._r1pc, self._r2, self._r2pc, c, lanes)
            found += self._hazards(Hazard.WAR, r, c, lanes, pc, addresses)
            found += self._same_instruction(c, lanes, pc, addresses)
            self._record(self._w1, self._w1pc, self._w2, self._w2pc, c, lanes, pc)
        else:
            self._record(self._r1, self._r1pc, self._r2, self._r2pc, c, lanes, pc)
        return found

    # -- pieces ---------------------------------------------------------------------------
    def _fresh(self, c: np.ndarray) -> None:
        stale = self._epoch[c] != self.epoch
        if stale.any():
            s = c[stale]
            self._epoch[s] = self.epoch
            for f in ("_w1", "_w2", "_r1", "_r2"):
                getattr(self, f)[s] = NONE

    @staticmethod
    def _other(a1, p1, a2, p2, c, lanes) -> tuple[np.ndarray, np.ndarray]:
        """Per access: a recorded lane other than its own (NONE if there is none), its pc."""
        x1, x2 = a1[c], a2[c]
        use1 = (x1 != NONE) & (x1 != lanes)
        use2 = ~use1 & (x2 != NONE) & (x2 != lanes)
        other = np.where(use1, x1, np.where(use2, x2, NONE))
        pcs = np.where(use1, p1[c], p2[c])
        return other, pcs

    @staticmethod
    def _hazards(kind: Hazard, found, c, lanes, pc: int, addresses) -> list[tuple]:
        other, pcs = found
        hit = np.flatnonzero(other != NONE)
        if hit.size == 0:
            return []
        out = []
        hit_pcs = pcs[hit]
        for p in np.unique(hit_pcs):
            first = hit[hit_pcs == p]
            i = int(first[0])
            out.append((kind, int(other[i]), int(p), int(lanes[i]), int(addresses[i]),
                        int(first.size)))
        return out

    @staticmethod
    def _same_instruction(c, lanes, pc: int, addresses) -> list[tuple]:
        """Lanes of one store that hit the same element (a reduction into one place)."""
        if c.size < 2:
            return []
        order = np.argsort(c, kind="stable")
        cs, ls = c[order], lanes[order]
        clash = np.flatnonzero((cs[1:] == cs[:-1]) & (ls[1:] != ls[:-1]))
        if clash.size == 0:
            return []
        i = int(clash[0])
        # NumPy stores the last of equal indices: the later lane is the one that wins
        return [(Hazard.WAW, int(ls[i]), pc, int(ls[i + 1]), int(addresses[order[i + 1]]),
                 int(clash.size))]

    @staticmethod
    def _record(a1, p1, a2, p2, c, lanes, pc: int) -> None:
        x1 = a1[c]
        empty = x1 == NONE
        if empty.any():
            a1[c[empty]] = lanes[empty]
        x1 = a1[c]
        p1[c[x1 == lanes]] = pc
        x2 = a2[c]
        second = (x1 != lanes) & ((x2 == NONE) | (x2 == lanes))
        if second.any():
            a2[c[second]] = lanes[second]
            p2[c[second]] = pc
