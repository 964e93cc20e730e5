"""The Gradio app: its page, views and handlers (docs/ARCHITECTURE.md)."""
