"""Data and domain: what a release is computed from, before any query is asked of it.

The attribute domain (:class:`Domain`, :class:`Attribute`), the vectorised encoding of raw survey
codes into it (:mod:`engine.data._encoding`), the geography's nodes and their keys
(:class:`Geography`, :func:`node_key`) and the households with their persons
(:class:`HierarchicalData`). The bottom layer of the engine: it imports nothing of the project,
so every package above (queries, privacy, synthesis, count-of-counts, H-GEM) can share these
types without an import cycle.
"""

from engine.data._arrays import repeat_runs, sorted_counts, unique_rows
from engine.data._domain import Attribute, Domain
from engine.data._encoding import bin_ranges, clip_sizes, householder_first_order, map_codes, multigenerational, segment_any
from engine.data._geography import LEVELS, Geography, Node, node_households, node_key, node_level, parse_node_key
from engine.data._hierarchical_data import HierarchicalData
from engine.data._npz import npz_names, read_npz

__all__ = [
    "Attribute",
    "Domain",
    "Geography",
    "HierarchicalData",
    "LEVELS",
    "Node",
    "bin_ranges",
    "clip_sizes",
    "householder_first_order",
    "map_codes",
    "multigenerational",
    "node_households",
    "node_key",
    "node_level",
    "npz_names",
    "parse_node_key",
    "read_npz",
    "repeat_runs",
    "sorted_counts",
    "unique_rows",
    "segment_any",
]
