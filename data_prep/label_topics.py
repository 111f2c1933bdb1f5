"""The topic labels of ORDER=topic TOPICS=embed: ``extra_info.topic`` of a prepared parquet set to its embedding
cluster (the ``labels`` extra).

    python data_prep/label_topics.py --in ~/data/ebpo/dapo_math.parquet --out ~/data/ebpo/dapo_topics.parquet

``--help`` lists every option; the logic is :mod:`ebpo_verl.data.label_topics`."""

from ebpo_verl.data.label_topics import main

if __name__ == "__main__":
    main(prog="python data_prep/label_topics.py")
