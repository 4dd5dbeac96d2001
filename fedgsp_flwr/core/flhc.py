"""FL+HC's clustering (Briggs, Fan and Andras, 2020): agglomerative hierarchical
clustering of the clients' local updates, cut at a distance threshold, and the nearest
cluster of an update seen later.

Pure numpy and scipy: ``scipy.cluster.hierarchy.linkage`` over the condensed distance
matrix of the updates (``scipy.spatial.distance.pdist``), ``fcluster`` at the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METRICS = ("euclidean", "manhattan", "cosine")
LINKAGES = ("ward", "complete", "average", "single")
_SCIPY_METRIC = {"euclidean": "euclidean", "manhattan": "cityblock", "cosine": "cosine"}


@dataclass(frozen=True)
class UpdateClusters:
    """The clusters of a set of updates.

    Attributes
    ----------
    labels : np.ndarray
        The cluster of each update (int64), numbered 0, 1, ... in the order of each
        cluster's first update.
    heights : np.ndarray
        The linkage distance of each of the n - 1 merges, ascending (the dendrogram's
        heights; empty for one update): the threshold keeps the merges up to it.
    centroids : np.ndarray
        The weighted mean update of each cluster, one row per cluster (float64).
    """

    labels: np.ndarray
    heights: np.ndarray
    centroids: np.ndarray

    @property
    def num_clusters(self) -> int:
        """The number of clusters."""
        return len(self.centroids)


def check_choice(metric: str, linkage: str) -> None:
    """Raise ``ValueError`` for an unknown metric or linkage, or Ward's linkage with a
    metric other than Euclidean (Ward's merge cost is a Euclidean variance)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {', '.join(LINKAGES)}, got {linkage!r}")
    if linkage == "ward" and metric != "euclidean":
        raise ValueError(f"linkage 'ward' needs metric 'euclidean', got {metric!r}: choose "
                         "another linkage for it")


def cluster_updates(updates: np.ndarray, weights: Sequence[float], threshold: float,
                    metric: str = "euclidean", linkage: str = "ward") -> UpdateClusters:
    """Cluster the rows of ``updates`` (one flattened local update a client) bottom-up
    with ``linkage`` over ``metric`` distances, keeping the merges at heights up to
    ``threshold`` (scipy's ``fcluster`` with ``criterion="distance"``).

    Parameters
    ----------
    updates : np.ndarray
        Shape (n, d), n >= 1.
    weights : Sequence[float]
        Each update's weight in its cluster's centroid (e.g. its example count), > 0.
    threshold : float
        Clusters whose linkage distance is above this are not merged (> 0).
    metric, linkage : str
        See :data:`METRICS` and :data:`LINKAGES`.

    Raises
    ------
    ValueError
        For an empty or non-finite ``updates``, weights that do not match or are not
        positive, a threshold that is not positive, or a bad metric or linkage.
    """
    from scipy.cluster.hierarchy import fcluster
    from scipy.cluster.hierarchy import linkage as build_linkage
    from scipy.spatial.distance import pdist

    check_choice(metric, linkage)
    x = np.asarray(updates, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0 or not np.isfinite(x).all():
        raise ValueError(f"updates must be a finite (n, d) array with n >= 1, got shape "
                         f"{x.shape}")
    if w.shape != (len(x),) or not (w > 0).all():
        raise ValueError(f"need one positive weight per update, got {w.tolist()}")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if metric == "cosine" and not (np.linalg.norm(x, axis=1) > 0).all():
        raise ValueError("a zero update has no cosine distance: choose another metric")
    if len(x) == 1:
        return UpdateClusters(np.zeros(1, dtype=np.int64), np.zeros(0), x.copy())
    tree = build_linkage(pdist(x, _SCIPY_METRIC[metric]), method=linkage)
    raw = fcluster(tree, t=threshold, criterion="distance")
    # scipy numbers clusters by the tree; renumber by first member, so that the same
    # updates in the same order always give the same labels.
    first: dict[int, int] = {}
    labels = np.array([first.setdefault(int(c), len(first)) for c in raw], dtype=np.int64)
    centroids = np.stack([np.average(x[labels == c], axis=0, weights=w[labels == c])
                          for c in range(len(first))])
    return UpdateClusters(labels, np.sort(tree[:, 2]), centroids)


def nearest_cluster(update: np.ndarray, centroids: np.ndarray, metric: str = "euclidean"
                    ) -> int:
    """The row of ``centroids`` nearest to ``update`` in ``metric`` (the first on a tie).

    Raises
    ------
    ValueError
        If the shapes differ, or for an unknown metric.
    """
    from scipy.spatial.distance import cdist

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    u = np.asarray(update, dtype=np.float64).reshape(1, -1)
    c = np.asarray(centroids, dtype=np.float64)
    if c.ndim != 2 or len(c) == 0 or c.shape[1] != u.shape[1]:
        raise ValueError(f"centroids of shape {c.shape} do not fit an update of length "
                         f"{u.shape[1]}")
    return int(np.argmin(cdist(u, c, _SCIPY_METRIC[metric])[0]))
