"""The reference model: an RNN encoder-decoder with attention, written to be read.

Read this before seq2seq/model/fast.py. It computes the same function as the fast model,
with the same parameter names and shapes (one state dict loads into either), in plain
torch: packed nn.GRU/nn.LSTM encoders, a decoder that runs one step at a time, a
masked softmax and F.cross_entropy. tests/test_reference.py holds the fast model to it.

Sizes: B sentences, S source and T target positions, E embedding, H hidden, V
vocabulary, D = 2H encoder state (H when not bidirectional). Encoder states h_j =
[fwd h_j ; bwd h_j]. Attention scores e_tj, by ``model.attention``:

    none      no scores: c = tanh(W_c [fwd h_S ; bwd h_1]) at every step (Cho et al. 2014)
    bahdanau  e_tj = vᵀ tanh(W s_{t-1} + U h_j)       query: previous state (Bahdanau et al.)
    luong     dot e_tj = h_tᵀ h_j,  general h_tᵀ W h_j,  scaled_dot h_tᵀ h_j / √H,
              concat vᵀ tanh(W h_t + U h_j)            query: new state (Luong et al. 2015)

(dot projects h_j to H first when D != H.) Then α_t = softmax of e_t over the real
source tokens (padding gets exactly 0) and the context c_t = Σ_j α_tj h_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

PAD_ID = 0  # the padding id (seq2seq/constants.py; tests/test_reference.py checks they agree)


def _holder(**modules: nn.Module) -> nn.Module:
    """An empty module holding ``modules``. It only gives their parameters the fast
    model's names (decoder.rnn.rnn.*, decoder.readout.proj.*), so one state dict fits both."""
    holder = nn.Module()
    for name, module in modules.items():
        holder.add_module(name, module)
    return holder


@dataclass
class Memory:
    """What the decoder reads from the encoder. states (B, S, D) h_j, zeros at padding;
    mask (B, S) True at real tokens; final (B, D) [fwd h_S ; bwd h_1]; keys (B, S, A)
    U h_j or W h_j, projected once per batch; context (B, D) the fixed c of ``none``."""

    states: Tensor
    mask: Tensor
    final: Tensor
    keys: Tensor | None
    context: Tensor | None

    def index_select(self, index: Tensor) -> Memory:
        """Sentences ``index`` (N,) of the batch: beam search repeats and drops rows."""
        return Memory(*(None if t is None else t.index_select(0, index) for t in
                        (self.states, self.mask, self.final, self.keys, self.context)))

    def repeat_rows(self, k: int) -> Memory:
        """Each sentence ``k`` times, consecutive: beam search's hypotheses."""
        return self.index_select(torch.arange(self.final.size(0), device=self.final.device)
                                 .repeat_interleave(k))


@dataclass
class State:
    """The decoder's recurrent state: h, c (layers, B, H) as nn.GRU/nn.LSTM take them (c:
    LSTM only); feed (B, H) the previous readout t_{t-1} (Luong's input feeding only)."""

    h: Tensor
    c: Tensor | None
    feed: Tensor | None

    def index_select(self, index: Tensor) -> State:
        """Sentences ``index`` (N,): beam search keeps the rows of the surviving hypotheses."""
        def pick(t: Tensor | None, dim: int) -> Tensor | None:
            return None if t is None else t.index_select(dim, index)
        return State(pick(self.h, 1), pick(self.c, 1), pick(self.feed, 0))


def reverse_each(x: Tensor, lengths: Tensor) -> Tensor:
    """(B, S, n) -> each row's first lengths[b] positions reversed; padding stays last."""
    return torch.stack([torch.cat([row[:n].flip(0), row[n:]]) for row, n in
                        zip(x, lengths.tolist(), strict=True)])


def run_packed(rnn: nn.RNNBase, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """x (B, S, n) -> outputs (B, S, H), zeros at padding, and the state after each
    sentence's last real token (B, H). Packing: the RNN never reads a padding position."""
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, last = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    if isinstance(last, tuple):  # an LSTM's (h, c): the decoder is bridged from h
        last = last[0]
    return out, last[-1]


class Encoder(nn.Module):
    """Source embeddings, then per layer a forward and a backward RNN; a layer reads the
    concatenated states of the one below."""

    def __init__(self, cfg: Any, vocab: int) -> None:
        super().__init__()
        rnn = nn.GRU if cfg.rnn_type == "gru" else nn.LSTM
        self.embedding = nn.Embedding(vocab, cfg.emb_size, padding_idx=PAD_ID)
        self.dropout = nn.Dropout(cfg.dropout)
        self.size = cfg.hidden_size * (2 if cfg.bidirectional else 1)  # D
        sizes = [cfg.emb_size] + [self.size] * (cfg.enc_layers - 1)
        self.fwd = nn.ModuleList(rnn(n, cfg.hidden_size, batch_first=True) for n in sizes)
        self.bwd = nn.ModuleList(rnn(n, cfg.hidden_size, batch_first=True) for n in sizes
                                 if cfg.bidirectional)

    def forward(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S), lengths (B,) -> states (B, S, D), final (B, D) = [fwd h_S ; bwd h_1]."""
        x = self.dropout(self.embedding(src))  # (B, S, E)
        for layer, fwd in enumerate(self.fwd):
            if layer > 0:
                x = self.dropout(x)
            out, last = run_packed(fwd, x, lengths)
            outs, finals = [out], [last]
            if self.bwd:  # reads each sentence from its last real token back to its first
                out, last = run_packed(self.bwd[layer], reverse_each(x, lengths), lengths)
                outs.append(reverse_each(out, lengths))
                finals.append(last)
            x = torch.cat(outs, dim=-1)  # (B, S, D)
        return x, torch.cat(finals, dim=-1)


class Attention(nn.Module):
    """The scores e_tj of one decoder step, the masked softmax and the context c_t."""

    def __init__(self, att: Any, enc_size: int, dec_size: int) -> None:
        super().__init__()
        if att.name not in ("none", "bahdanau", "luong") or (
                att.name == "luong" and att.score not in ("dot", "general", "concat", "scaled_dot")):
            raise ValueError(f"unknown attention {att.name!r} (score {att.score!r})")
        self.name = att.name
        self.additive = att.name == "bahdanau" or (att.name == "luong" and att.score == "concat")
        self.scale = dec_size ** -0.5 if att.name == "luong" and att.score == "scaled_dot" else 1.0
        size = att.attn_size or dec_size
        if att.name == "none":
            self.proj = nn.Linear(enc_size, enc_size)  # W_c
        elif self.additive:
            self.scorer = _holder(query_proj=nn.Linear(dec_size, size, bias=False),  # W
                                  key_proj=nn.Linear(enc_size, size),  # U (and the bias)
                                  v=nn.Linear(size, 1, bias=False))
        elif att.score == "general" or enc_size != dec_size:  # W, or dot's projection to H
            self.scorer = _holder(key_proj=nn.Linear(enc_size, dec_size, bias=False))
        else:
            self.scorer = None  # dot, sizes equal: the keys are the states themselves

    def init(self, states: Tensor, mask: Tensor, final: Tensor) -> Memory:
        """Once per batch: project the keys (B, S, A), or form none's fixed c (B, D)."""
        if self.name == "none":
            return Memory(states, mask, final, None, torch.tanh(self.proj(final)))
        keys = states if self.scorer is None else self.scorer.key_proj(states)
        return Memory(states, mask, final, keys, None)

    def forward(self, query: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """query (B, H) -> context c_t (B, D), weights α_t (B, S) (none: all zero)."""
        if self.name == "none":
            return memory.context, torch.zeros(memory.mask.shape, dtype=memory.states.dtype,
                                               device=memory.states.device)
        if self.additive:  # vᵀ tanh(W q + U h_j): (B, 1, A) + (B, S, A) -> (B, S)
            q = self.scorer.query_proj(query).unsqueeze(1)
            scores = self.scorer.v(torch.tanh(q + memory.keys)).squeeze(-1)
        else:  # qᵀ k_j for every j: (B, S, H) @ (B, H, 1) -> (B, S)
            scores = torch.bmm(memory.keys, query.unsqueeze(-1)).squeeze(-1) * self.scale
        # exp(-inf) = 0: padding gets exactly zero weight and the real tokens sum to one
        weights = torch.softmax(scores.masked_fill(~memory.mask, float("-inf")), dim=-1)
        context = torch.bmm(weights.unsqueeze(1), memory.states).squeeze(1)  # Σ_j α_tj h_j
        return context, weights


class Decoder(nn.Module):
    """Target embeddings, the bridge, a stacked RNN run one step at a time, the readout
    and the output layer. One step, with emb = E y_{t-1}:

        none, bahdanau:  c_t = att(s_{t-1});  s_t = RNN(s_{t-1}, [emb; c_t])
        luong:           s_t = RNN(s_{t-1}, [emb; t_{t-1}]);  c_t = att(s_t)  (t_{t-1}: input feeding)
        readout          t_t = tanh(W_o [s_t; c_t; emb])  (emb: deep output; maxout: max of unit pairs)
        logits           W_s t_t + b   (tied: E P t_t + b, P: H -> E when they differ)

    For Luong, t_t is h~_t = tanh(W_c [c_t; h_t]) (W_o's columns in another order).
    """

    def __init__(self, cfg: Any, vocab: int, enc_size: int, attention: Attention) -> None:
        super().__init__()
        att, hidden, emb, layers = cfg.attention, cfg.hidden_size, cfg.emb_size, cfg.dec_layers
        self.attention = attention
        self.luong = att.name == "luong"
        self.feeds_input = self.luong and att.input_feeding
        # Luong et al. read [s_t; c_t] only; deep output (Bahdanau, none) adds emb
        self.reads_emb = cfg.deep_output and (not self.luong or att.deep_output)
        self.maxout = cfg.maxout
        self.embedding = nn.Embedding(vocab, emb, padding_idx=PAD_ID)
        self.dropout = nn.Dropout(cfg.dropout)
        rnn_in = emb + (hidden if self.feeds_input else 0) + (0 if self.luong else enc_size)
        rnn = nn.GRU if cfg.rnn_type == "gru" else nn.LSTM
        self.rnn = _holder(rnn=rnn(rnn_in, hidden, layers, batch_first=True,
                                   dropout=cfg.dropout if layers > 1 else 0.0))
        self.bridge = nn.Linear(enc_size, layers * hidden)  # s_0 = tanh(W_b final)
        self.bridge_cell = nn.Linear(enc_size, layers * hidden) if cfg.rnn_type == "lstm" else None
        readout_in = hidden + enc_size + (emb if self.reads_emb else 0)
        self.readout = _holder(proj=nn.Linear(readout_in, hidden * (2 if cfg.maxout else 1)))
        self.tied = cfg.tie_embeddings
        if self.tied:  # W_s = E, the target embeddings
            self.tie_proj = nn.Linear(hidden, emb, bias=False) if hidden != emb else None
            self.out_bias = nn.Parameter(torch.zeros(vocab))
        else:
            self.output = nn.Linear(hidden, vocab)

    def init_state(self, final: Tensor) -> State:
        """final (B, D) -> every layer's first state through the learned bridge."""
        def per_layer(x: Tensor) -> Tensor:  # (B, layers*H) -> (layers, B, H)
            return x.view(x.size(0), -1, self.rnn.rnn.hidden_size).transpose(0, 1).contiguous()
        h = per_layer(torch.tanh(self.bridge(final)))
        c = None if self.bridge_cell is None else per_layer(self.bridge_cell(final))
        feed = final.new_zeros(final.size(0), self.rnn.rnn.hidden_size) if self.feeds_input else None
        return State(h, c, feed)

    def step(self, y_prev: Tensor, state: State, memory: Memory) -> tuple[Tensor, State, Tensor]:
        """y_prev (B,) -> logits (B, V), the next State, attention weights (B, S)."""
        emb = self.dropout(self.embedding(y_prev))  # (B, E)
        if self.luong:  # the RNN first, then attend with the new state s_t
            x = torch.cat([emb, state.feed], -1) if self.feeds_input else emb
            s, h, c = self.rnn_step(x, state)
            context, weights = self.attention(s, memory)
        else:  # attend with the top layer's previous state s_{t-1}, then the RNN
            context, weights = self.attention(state.h[-1], memory)
            s, h, c = self.rnn_step(torch.cat([emb, context], -1), state)
        parts = [s, context, emb] if self.reads_emb else [s, context]
        z = self.readout.proj(torch.cat(parts, -1))  # (B, H), or (B, 2H) for maxout
        # maxout (Goodfellow et al. 2013): the larger of each pair of adjacent units
        t = z.unflatten(-1, (-1, 2)).amax(-1) if self.maxout else torch.tanh(z)  # (B, H)
        return self.logits(t), State(h, c, t if self.feeds_input else None), weights

    def rnn_step(self, x: Tensor, state: State) -> tuple[Tensor, Tensor, Tensor | None]:
        """x (B, n) -> the top layer's s_t (B, H) and every layer's h, c (layers, B, H):
        the stacked nn.GRU/nn.LSTM run over a sequence of length one."""
        if state.c is None:
            out, h = self.rnn.rnn(x.unsqueeze(1), state.h)
            return out.squeeze(1), h, None
        out, (h, c) = self.rnn.rnn(x.unsqueeze(1), (state.h, state.c))
        return out.squeeze(1), h, c

    def logits(self, t: Tensor) -> Tensor:
        """Readout t (B, H) -> logits (B, V)."""
        t = self.dropout(t)
        if self.tied:
            t = t if self.tie_proj is None else self.tie_proj(t)
            return F.linear(t, self.embedding.weight, self.out_bias)
        return self.output(t)


class ReferenceSeq2Seq(nn.Module):
    """The model behind ``model.impl=reference``; search and training call only what
    the fast Seq2Seq offers them: encode, init_state, step and forward."""

    def __init__(self, cfg: Any, src_vocab: int, tgt_vocab: int) -> None:
        """cfg: the ``model`` config (seq2seq/config/schema.py ModelConfig), read as attributes."""
        super().__init__()
        self.encoder = Encoder(cfg, src_vocab)
        attention = Attention(cfg.attention, self.encoder.size, cfg.hidden_size)
        self.decoder = Decoder(cfg, tgt_vocab, self.encoder.size, attention)

    def encode(self, src: Tensor, src_lens: Tensor) -> Memory:
        """src (B, S) padded with PAD_ID, src_lens (B,) each >= 1 -> Memory."""
        assert src.dim() == 2 and src_lens.shape == (src.size(0),), "src (B, S), src_lens (B,)"
        lengths = src_lens.to(src.device)
        mask = torch.arange(src.size(1), device=src.device) < lengths.unsqueeze(1)  # (B, S)
        states, final = self.encoder(src, lengths)
        return self.decoder.attention.init(states, mask, final)

    def init_state(self, memory: Memory) -> State:
        return self.decoder.init_state(memory.final)

    def step(self, y_prev: Tensor, state: State, memory: Memory) -> tuple[Tensor, State, Tensor]:
        """y_prev (B,) -> logits (B, V), the next State, attention weights (B, S)."""
        return self.decoder.step(y_prev, state, memory)

    def forward_with_attention(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor,
                               teacher_forcing: float = 1.0) -> tuple[Tensor, Tensor]:
        """tgt_in (B, T) = BOS + target -> logits (B, T, V), weights (B, T, S).

        teacher_forcing < 1: scheduled sampling (Bengio et al. 2015), each sentence
        reads its own previous argmax with probability 1 - teacher_forcing.
        """
        memory = self.encode(src, src_lens)
        state = self.init_state(memory)
        logits, weights = [], []
        for t in range(tgt_in.size(1)):
            y = tgt_in[:, t]
            if t > 0 and teacher_forcing < 1.0:  # draws as the fast model does, for the tests
                keep = torch.rand(y.shape, device=y.device) < teacher_forcing
                y = torch.where(keep, y, logits[-1].detach().argmax(dim=-1))
            step_logits, state, w = self.step(y, state, memory)
            logits.append(step_logits)
            weights.append(w)
        return torch.stack(logits, dim=1), torch.stack(weights, dim=1)

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, teacher_forcing: float = 1.0,
                targets: Tensor | None = None, label_smoothing: float = 0.0) -> Tensor:
        """Logits (B, T, V); with targets (B, T) = target + EOS, padded, the summed
        cross-entropy over their real tokens instead (what training minimises)."""
        logits, _ = self.forward_with_attention(src, src_lens, tgt_in, teacher_forcing)
        if targets is None:
            return logits
        # (B*T, V) against (B*T,); padding positions are no tokens: ignore_index skips them
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID,
                               reduction="sum", label_smoothing=label_smoothing)
