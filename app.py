"""Gradio app (issue: Gradio app). Not built yet."""
import sys

if __name__ == "__main__":
    sys.exit("app.py: the Gradio app is not built yet; see the project's open issues.")
