"""Topic labels of ORDER=topic TOPICS=embed: ``extra_info.topic`` set to a cluster (--help; docs/data.md)."""

from ebpo_verl.data.label_topics import main

if __name__ == "__main__":
    main(prog="python data_prep/label_topics.py")
