"""kvscope dashboard: a Streamlit app that draws the engine's paged KV cache.

It draws, never computes engine state: live state comes folded by the websocket
client, replayed state by ``engine.events.folds.reducer`` over stored steps. Nothing
here imports torch or the model (tests/dashboard/test_no_torch.py holds that).
"""
