from privalign.cli import entrypoint

entrypoint()
