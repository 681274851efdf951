"""Baselines of the evaluation harness, one module each (DESIGN.md section 7.7).

=====================  ===============  ==========================================================
module                 privacy          what
=====================  ===============  ==========================================================
nonprivate             none             k-means++ (best of 5); "standard" random-start k-means
dbscan                 none             scikit-learn DBSCAN with a k-distance radius
dplloyd                central DP       DPLloyd (Blum et al. 2005; Su et al. 2016)
dp_quadtree_kmeans     central DP       DPQTk-means, ``papers/001``
improved_dp_kmeans     central DP (*)   density/AM initialisation + DP Lloyd, ``papers/003``
laplace_points         LDP              discrete-Laplace points + k-means (floor a)
oue_grid               LDP              one OUE grid histogram + weighted k-means (floor b)
grid                   LDP              the collector's GRID campaigns (AGCluster, ``papers/002``):
                                        UGC, TreeAdaptive, IterAdaptive; labels, no centers
center_campaigns       LDP              the collector's center-publishing campaigns (kCluster, mnFCM,
                                        FCM, interactive k-means, net-tree, Stemmer); centers
=====================  ===============  ==========================================================

(*) as published, the initialisation reads raw data without noise (see the module).
"""

from ._common import Box, Clustering
from .center_campaigns import center_campaign
from .dbscan import dbscan_baseline
from .dp_quadtree_kmeans import dp_quadtree_kmeans
from .dplloyd import dplloyd
from .grid import grid_clustering
from .improved_dp_kmeans import density_am_kmeans, improved_dp_kmeans
from .laplace_points import discrete_laplace_kmeans
from .nonprivate import kmeans_plus_plus_baseline, standard_kmeans
from .oue_grid import oue_grid_kmeans

__all__ = [
    "Box",
    "Clustering",
    "center_campaign",
    "dbscan_baseline",
    "density_am_kmeans",
    "discrete_laplace_kmeans",
    "dp_quadtree_kmeans",
    "dplloyd",
    "grid_clustering",
    "improved_dp_kmeans",
    "kmeans_plus_plus_baseline",
    "oue_grid_kmeans",
    "standard_kmeans",
]
