"""Batch captioning over files and folders (issue: batch captioning). Not built yet."""
import sys

if __name__ == "__main__":
    sys.exit("caption.py: batch captioning is not built yet; see the project's open issues.")
