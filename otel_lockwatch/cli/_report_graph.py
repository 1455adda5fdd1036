"""The lock-order graph of the HTML report, laid out in layers so that no label is crossed.

Design notes
------------
A reader of the graph wants three things at a glance: which lock was held while which was
taken (an arrow), who did it (the worker, on the arrow), and which arrows close a cycle (red).
A circle layout with labels at the middle of curved chords fails the second: two arrows between
the same pair put their labels on top of each other, and chords cross the names of the nodes
they pass. This module uses the layered drawing of Sugiyama, Tagawa and Toda (1981), the method
of Graphviz's ``dot``, reduced to what a lock-order graph of at most ``MAX_GRAPH_NODES`` locks
needs, with one rule that makes the labels safe by construction:

1. *Cycles are broken* by a depth-first search in the report's node order (cycle members
   first): an edge to a node still on the stack is laid out reversed and drawn pointing back.
2. *Layers* are assigned in topological order, each lock one layer below the lowest lock it
   was held under, and pushed further down while its layer is full (the width of the page, not
   the length of the longest path, bounds a layer: Coffman and Graham's idea, greedily).
3. *Bands*. The drawing is a stack of horizontal bands: a band per layer of locks, and between
   two layers one or more bands of edge labels. Each edge runs through every band between its
   two locks, and in exactly one of them carries its label, to the right of its line; a gap
   gets one more label band whenever its labels would not fit the width. Within a band each
   item (a lock's box, an edge's line with its label, an edge's bare line) has an x-interval
   of its own, separated from its neighbours; *between* two bands, in the gaps, there is
   nothing but the curves of the edges, which are monotone in y and so never enter a band.
   Hence no label overlaps another label or any edge: everything in a band is apart, and the
   only things outside the bands are curves. A self-loop is drawn inside its lock's item.
4. *Order and position*. Within a band the items are ordered by the barycentre of their
   neighbours in the band above, then below, a few sweeps (the usual crossing reduction); each
   band's x positions are then pulled towards their neighbours' while keeping the order and the
   separation, which is an isotonic regression solved exactly by pool-adjacent-violators.

The size follows the graph: two locks and their cycle take a few bands, about 150 px; a graph
wider than the page is scaled down by the page's CSS rather than overflow, its labels still
apart. The estimated text widths are those of the monospaced fonts of the page's CSS, rounded up.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

__all__ = ["MAX_GRAPH_NODES", "drawn_nodes", "svg_lock_order"]

#: How many locks the lock-order graph draws (cycle members first); the DOT output has them all.
MAX_GRAPH_NODES = 40

_e = html.escape

# Geometry, in CSS pixels.
_BUDGET = 680.0  # the widest a band is filled before a layer or a label band is added
_NODE_CHAR, _LABEL_CHAR = 7.6, 6.9  # upper bounds of a character's advance at 12 px / 11 px
_NODE_H, _LABEL_H = 24.0, 16.0  # band heights
_GAP = 22.0  # between two bands: the edges' curves
_SEP = 14.0  # between two items of a band
_PAD = 8.0  # inside a lock's box, each side
_MARGIN = 10.0
_LOOP_W = 22.0  # a self-loop, right of its lock's box
_NAME_MAX, _WORKER_MAX = 32, 24  # characters shown; the rest goes to the tooltip


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Item:
    """One thing in a band: a lock's box, or an edge passing through (with its label or not)."""

    __slots__ = ("edge", "label", "node", "w", "x")

    def __init__(self, w: float, node: str | None = None, edge: int = -1, label: str = "") -> None:
        self.node, self.edge, self.label, self.w, self.x = node, edge, label, w, 0.0

    def anchor(self) -> float:
        """Where edges meet it: a box's centre, an edge's line (the item's left side)."""
        return self.x + self.w / 2 if self.node is not None else self.x


def _layers(nodes: Sequence[str], edges: list[tuple[str, str]], widths: Mapping[str, float]):
    """Layer of each node, after breaking cycles; which edges are laid out reversed."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for u, v in edges:
        out[u].append(v)
    reversed_edges: set[int] = set()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    index = {pair: i for i, pair in enumerate(edges)}
    for root in nodes:  # iterative DFS: 40 locks deep is fine, but a stack is never wrong
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(out[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                reversed_edges.add(index[(node, child)])
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))
    layout = [(v, u) if i in reversed_edges else (u, v) for i, (u, v) in enumerate(edges)]
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    indegree = dict.fromkeys(nodes, 0)
    for u, v in layout:
        preds[v].append(u)
        indegree[v] += 1
    ready = [n for n in nodes if indegree[n] == 0]
    layer: dict[str, int] = {}
    filled: dict[int, float] = {}
    while ready:
        n = ready.pop(0)
        at = max((layer[p] + 1 for p in preds[n]), default=0)
        while filled.get(at, 0.0) and filled[at] + widths[n] > _BUDGET:
            at += 1
        layer[n] = at
        filled[at] = filled.get(at, 0.0) + widths[n] + _SEP
        for u, v in layout:
            if u == n:
                indegree[v] -= 1
                if indegree[v] == 0:
                    ready.append(v)
    return layer, layout, reversed_edges


def _pava(desired: list[float], spacing: list[float]) -> list[float]:
    """Positions closest (least squares) to ``desired`` with ``x[i] - x[i-1] >= spacing[i]``."""
    offsets, total = [], 0.0
    for s in spacing:
        total += s
        offsets.append(total)
    blocks: list[list[float]] = []  # [mean, weight]
    for d, o in zip(desired, offsets, strict=True):
        blocks.append([d - o, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2 = blocks.pop()
            m1, w1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    out: list[float] = []
    for mean, weight in blocks:
        out += [mean] * int(weight)
    return [y + o for y, o in zip(out, offsets, strict=True)]


def drawn_nodes(graph: Mapping[str, Any]) -> list[str]:
    """The locks the drawing shows: the members of a cycle, then the most connected others (so
    what is drawn of a large graph is its densest part, not its first names), at most
    ``MAX_GRAPH_NODES``, in the report's order."""
    degree: dict[str, int] = {}
    for e in graph["edges"]:
        for n in (e["holding"], e["acquiring"]):
            degree[n] = degree.get(n, 0) + 1
    in_cycle = {n for e in graph["edges"] if e["cycle"] for n in (e["holding"], e["acquiring"])}
    order = {n: i for i, n in enumerate(graph["nodes"])}
    ranked = sorted(graph["nodes"], key=lambda n: (n not in in_cycle, -degree.get(n, 0), order[n]))
    keep = set(ranked[:MAX_GRAPH_NODES])
    return [n for n in graph["nodes"] if n in keep]


def svg_lock_order(graph: Mapping[str, Any]) -> str:
    """The lock-order graph of :func:`~._report_model.build_report` as an inline SVG.

    Locks are boxes (``g.node``, ``.cycle`` for a cycle's member, ``data-lock``), edges paths
    from the holding lock to the acquired one (``path.edge``, ``.cycle``, ``data-holding``,
    ``data-acquiring``) labelled with the worker that took them (``text.edge-label``); a
    tooltip of each gives its full name and the acquisition sites.
    """
    nodes = drawn_nodes(graph)
    drawn = set(nodes)
    edges = [e for e in graph["edges"] if e["holding"] in drawn and e["acquiring"] in drawn]
    if not nodes:
        return (
            '<svg id="lock-order-graph" xmlns="http://www.w3.org/2000/svg" width="360" '
            'height="40" viewBox="0 0 360 40" role="img" aria-label="lock-order graph">'
            '<text x="10" y="24">no nested acquisition was recorded</text></svg>'
        )
    loops = [e for e in edges if e["holding"] == e["acquiring"]]
    links = [e for e in edges if e["holding"] != e["acquiring"]]
    labels = [_cut(str(e["worker"]), _WORKER_MAX) if e["worker"] else "" for e in links]
    loop_of = {e["holding"]: e for e in loops}
    box_w = {n: len(_cut(n, _NAME_MAX)) * _NODE_CHAR + 2 * _PAD for n in nodes}
    widths = {}
    for n in nodes:
        widths[n] = box_w[n]
        if n in loop_of:
            worker = _cut(str(loop_of[n]["worker"] or ""), _WORKER_MAX)
            widths[n] += _LOOP_W + len(worker) * _LABEL_CHAR + 4

    layer, layout, reversed_edges = _layers(
        nodes, [(e["holding"], e["acquiring"]) for e in links], widths
    )

    # Label bands: each edge's label goes to the least filled band of a gap it spans.
    depth = max(layer.values()) + 1
    gap_bands: list[list[float]] = [[0.0] for _ in range(depth)]  # used width per label band
    where: dict[int, tuple[int, int]] = {}
    order = sorted(range(len(links)), key=lambda i: layer[layout[i][1]] - layer[layout[i][0]])
    for i in order:
        w = len(labels[i]) * _LABEL_CHAR + 6 + _SEP
        top, bottom = layer[layout[i][0]], layer[layout[i][1]]
        options = [(used, g, b) for g in range(top, bottom) for b, used in enumerate(gap_bands[g])]
        fits = [o for o in options if o[0] + w <= _BUDGET or o[0] == 0.0]
        if fits:
            _, g, b = min(fits)
        else:
            g = min(range(top, bottom), key=lambda g: len(gap_bands[g]))
            gap_bands[g].append(0.0)
            b = len(gap_bands[g]) - 1
        gap_bands[g][b] += w
        where[i] = (g, b)

    # The bands, top to bottom: ("node", layer) or ("label", gap, band).
    band_keys: list[tuple[int, ...]] = []
    for at in range(depth):
        band_keys.append((0, at))
        if at < depth - 1:
            band_keys += [(1, at, b) for b in range(len(gap_bands[at]))]
    band_of = {key: i for i, key in enumerate(band_keys)}
    bands: list[list[_Item]] = [[] for _ in band_keys]
    item_of: dict[str, _Item] = {}
    for n in nodes:
        item_of[n] = _Item(widths[n], node=n)
        bands[band_of[(0, layer[n])]].append(item_of[n])
    chains: list[list[_Item]] = []  # per edge: its items, top to bottom, ends included
    for i, (u, v) in enumerate(layout):
        chain = [item_of[u]]
        for at in range(layer[u], layer[v]):
            if at > layer[u]:
                item = _Item(0.0, edge=i)
                bands[band_of[(0, at)]].append(item)
                chain.append(item)
            for b in range(len(gap_bands[at])):
                text = labels[i] if where[i] == (at, b) else ""
                item = _Item(len(text) * _LABEL_CHAR + 6 if text else 0.0, edge=i, label=text)
                bands[band_of[(1, at, b)]].append(item)
                chain.append(item)
        chain.append(item_of[v])
        chains.append(chain)
    up: dict[int, list[_Item]] = {id(it): [] for band in bands for it in band}
    down: dict[int, list[_Item]] = {id(it): [] for band in bands for it in band}
    for chain in chains:
        for above, below in pairwise(chain):
            down[id(above)].append(below)
            up[id(below)].append(above)

    # Crossing reduction: barycentres of the neighbours' ranks, sweeping down then up.
    for _ in range(4):
        for sweep, neighbours in (
            (range(1, len(bands)), up),
            (range(len(bands) - 2, -1, -1), down),
        ):
            for k in sweep:
                rank = {id(it): r for band in bands for r, it in enumerate(band)}
                band = bands[k]

                def key(
                    pos: int, band: list[_Item] = band, rank: dict = rank, around: dict = neighbours
                ) -> float:
                    near = around[id(band[pos])]
                    return sum(rank[id(n)] for n in near) / len(near) if near else float(pos)

                bands[k] = [band[p] for p in sorted(range(len(band)), key=key)]

    # Positions: packed, then pulled towards the neighbours' anchors (order and gaps kept).
    for band in bands:
        x = 0.0
        for it in band:
            it.x, x = x, x + it.w + _SEP
    for _ in range(6):
        for sweep, neighbours in (
            (range(len(bands)), up),
            (range(len(bands) - 1, -1, -1), down),
        ):
            for k in sweep:
                band = bands[k]
                desired = []
                for it in band:
                    near = neighbours[id(it)]
                    target = sum(n.anchor() for n in near) / len(near) if near else it.anchor()
                    desired.append(target - (it.w / 2 if it.node is not None else 0.0))
                spacing = [0.0] + [a.w + _SEP for a in band[:-1]]
                for it, x in zip(band, _pava(desired, spacing), strict=True):
                    it.x = x
    left = min(it.x for band in bands for it in band)
    for band in bands:
        for it in band:
            it.x += _MARGIN - left
    width = max(it.x + it.w for band in bands for it in band) + _MARGIN
    tops, y = [], _MARGIN
    for band_key in band_keys:
        tops.append(y)
        y += (_NODE_H if band_key[0] == 0 else _LABEL_H) + _GAP
    height = y - _GAP + _MARGIN

    # Ports: a lock's edges leave its bottom and enter its top spread out, in the order of the
    # items they go to, so two edges between the same locks are two lines.
    port: dict[tuple[int, int], float] = {}
    for n in nodes:
        it = item_of[n]
        for neighbours in (down, up):
            near = sorted(neighbours[id(it)], key=lambda o: o.anchor())
            for j, other in enumerate(near):
                port[(id(it), id(other))] = it.x + box_w[n] * (j + 1) / (len(near) + 1)

    cycle_nodes = {n for e in edges if e["cycle"] for n in (e["holding"], e["acquiring"])}
    parts = [
        f'<svg id="lock-order-graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="lock-order graph">',
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" '
        'markerWidth="9" markerHeight="9" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#6e7781"/></marker>'
        '<marker id="arrow-cycle" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerUnits="userSpaceOnUse" markerWidth="10" markerHeight="10" orient="auto">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#c62828"/></marker></defs>',
    ]
    band_index = {id(it): k for k, band in enumerate(bands) for it in band}
    for i, e in enumerate(links):
        chain = chains[i]
        points: list[tuple[float, float]] = []
        first, last = chain[0], chain[-1]
        points.append((port[(id(first), id(chain[1]))], tops[band_index[id(first)]] + _NODE_H))
        for it in chain[1:-1]:
            k = band_index[id(it)]
            h = _NODE_H if band_keys[k][0] == 0 else _LABEL_H
            points += [(it.x, tops[k]), (it.x, tops[k] + h)]
        points.append((port[(id(last), id(chain[-2]))], tops[band_index[id(last)]]))
        if i in reversed_edges:
            points.reverse()
        d = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
        for (x1, y1), (x2, y2) in pairwise(points):
            if x1 == x2:
                d.append(f"L{x2:.1f},{y2:.1f}")
            else:
                m = (y1 + y2) / 2
                d.append(f"C{x1:.1f},{m:.1f} {x2:.1f},{m:.1f} {x2:.1f},{y2:.1f}")
        parts.append(_edge_path(e, " ".join(d)))
        for it in chain[1:-1]:
            if it.label:
                k = band_index[id(it)]
                parts.append(_edge_label(e, it.label, it.x + 5, tops[k] + _LABEL_H - 4))
    for n in nodes:
        it = item_of[n]
        top = tops[band_index[id(it)]]
        cls = "node cycle" if n in cycle_nodes else "node"
        parts.append(
            f'<g class="{cls}" data-lock="{_e(n)}"><title>{_e(n)}</title>'
            f'<rect x="{it.x:.1f}" y="{top:.1f}" width="{box_w[n]:.1f}" height="{_NODE_H:.0f}" '
            f'rx="5"/><text x="{it.x + _PAD:.1f}" y="{top + 16:.1f}">{_e(_cut(n, _NAME_MAX))}'
            "</text></g>"
        )
        if n in loop_of:
            e = loop_of[n]
            x0 = it.x + box_w[n]
            parts.append(
                _edge_path(
                    e,
                    f"M{x0:.1f},{top + 7:.1f} C{x0 + 20:.1f},{top - 2:.1f} "
                    f"{x0 + 20:.1f},{top + _NODE_H + 2:.1f} {x0 + 1:.1f},{top + _NODE_H - 7:.1f}",
                )
            )
            if e["worker"]:
                worker = _cut(str(e["worker"]), _WORKER_MAX)
                parts.append(_edge_label(e, worker, x0 + _LOOP_W, top + 16))
    parts.append("</svg>")
    return "".join(parts)


def _edge_path(e: Mapping[str, Any], d: str) -> str:
    cls = "edge cycle" if e["cycle"] else "edge"
    marker = "arrow-cycle" if e["cycle"] else "arrow"
    tip = f"{e['worker'] or '?'} held {e['holding']} then acquired {e['acquiring']}"
    if e["sites"][0] or e["sites"][1]:
        tip += f" ({e['sites'][0] or '?'} -> {e['sites'][1] or '?'})"
    return (
        f'<path class="{cls}" data-holding="{_e(e["holding"])}" '
        f'data-acquiring="{_e(e["acquiring"])}" d="{d}" marker-end="url(#{marker})">'
        f"<title>{_e(tip)}</title></path>"
    )


def _edge_label(e: Mapping[str, Any], text: str, x: float, y: float) -> str:
    cls = "edge-label cycle" if e["cycle"] else "edge-label"
    return (
        f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" data-holding="{_e(e["holding"])}" '
        f'data-acquiring="{_e(e["acquiring"])}"><title>{_e(str(e["worker"]))}</title>'
        f"{_e(text)}</text>"
    )
