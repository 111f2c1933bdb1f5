"""The topic labels of ORDER=topic TOPICS=embed: ``extra_info.topic`` of a prepared parquet set to its cluster.

``--help`` lists the options; the logic is :mod:`ebpo_verl.data.label_topics` (docs/data.md)."""

from ebpo_verl.data.label_topics import main

if __name__ == "__main__":
    main(prog="python data_prep/label_topics.py")
