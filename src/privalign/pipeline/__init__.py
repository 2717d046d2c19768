"""Generate → score → write scored pools: :mod:`privalign.pipeline.build_pool` (local backend, resumable),
:mod:`privalign.pipeline.ray_backend` (Ray Data), :mod:`privalign.pipeline.gold` (the IMDb gold reward).
See docs/models.md."""
