"""Encoder-decoder Transformer for sequence-to-sequence tasks (built on ``torch.nn.Transformer``)."""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Seq2SeqTransformer"]


class Seq2SeqTransformer(nn.Module):
    """Token embeddings + sinusoidal positions + ``nn.Transformer`` + output projection.

    Token id ``pad_id`` is padding (masked out of attention). Inputs are batch-first
    ``(batch, length)`` integer tensors.
    """

    def __init__(self, *, src_vocab: int, tgt_vocab: int, d_model: int = 128, nhead: int = 4,
                 num_encoder_layers: int = 2, num_decoder_layers: int = 2, dim_feedforward: int = 256,
                 dropout: float = 0.1, max_len: int = 256, pad_id: int = 0):
        super().__init__()
        self.pad_id, self.d_model = pad_id, d_model
        self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=pad_id)
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pos", pe, persistent=False)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True)
        # The nested-tensor fast path is a prototype that warns on every padded batch.
        encoder = nn.TransformerEncoder(layer, num_encoder_layers, norm=nn.LayerNorm(d_model),
                                        enable_nested_tensor=False)
        self.transformer = nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
                                          dim_feedforward, dropout, custom_encoder=encoder,
                                          batch_first=True)
        self.out = nn.Linear(d_model, tgt_vocab)

    def _embed(self, emb: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return emb(tokens) * math.sqrt(self.d_model) + self.pos[: tokens.shape[1]]

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = src == self.pad_id
        return self.transformer.encoder(self._embed(self.src_embed, src), src_key_padding_mask=mask), mask

    def decode(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        n = tgt_in.shape[1]
        # Boolean like the padding masks (mixing float and bool masks is deprecated in torch).
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=tgt_in.device), diagonal=1)
        h = self.transformer.decoder(self._embed(self.tgt_embed, tgt_in), memory, tgt_mask=causal,
                                     tgt_is_causal=True, tgt_key_padding_mask=tgt_in == self.pad_id,
                                     memory_key_padding_mask=src_mask)
        return self.out(h)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, tgt_len, tgt_vocab)`` for teacher-forced decoder input ``tgt_in``."""
        memory, mask = self.encode(src)
        return self.decode(memory, mask, tgt_in)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, *, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
        """Greedy decoding; returns ``(batch, <= max_len)`` token ids after BOS (EOS then padding)."""
        memory, mask = self.encode(src)
        ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            nxt = self.decode(memory, mask, ys)[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done |= nxt == eos_id
            if bool(done.all()):
                break
        return ys[:, 1:]
