"""A llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA), optional `lax.scan` over layers, adamw (or another
optimizer with optax's interface).

The model `integration/fixtures/make_fixtures.py` makes the `llama_scan_bf16` fixture and the stock-XLA
timings with, importable (no side effects at import)."""
import jax
import jax.numpy as jnp

# name -> (vocab, d, heads, kv_heads, layers, ffn, dtype, scan, batch, seq)
CONFIGS = {
    # the llama_scan_bf16 fixture
    "llama_scan_bf16": (512, 256, 4, 2, 3, 512, jnp.bfloat16, True, 4, 64),
    # llama_sgd_f32-sized unrolled f32 model (make_fixtures.py "llama_small_f32_unrolled")
    "llama_small_f32": (1024, 512, 8, 4, 4, 1536, jnp.float32, False, 8, 256),
    # 110M-parameter bf16 scan model (make_fixtures.py "llama_110m_bf16_scan")
    "llama_110m_bf16": (32000, 1024, 16, 8, 8, 2816, jnp.bfloat16, True, 8, 1024),
    # MaxText-like (its llama2 decoder defaults, scaled down to run in seconds): bf16 weights,
    # scan over layers, multi-head attention (kv_heads == heads), SwiGLU, 32k vocab, adamw
    "maxtext_tiny_bf16": (32000, 512, 8, 8, 4, 1408, jnp.bfloat16, True, 4, 512),
}


def make_llama(vocab, d, heads, kv_heads, layers, ffn, dtype, scan, opt=None):
    """Returns (make_state(key) -> state, train_step(state, tokens) -> (state, loss)); `opt`: the optimizer
    (`init`, `update` as optax's; default optax's adamw at 1e-3)."""
    def init(key):
        ks = jax.random.split(key, 8)

        def w(k, shape):
            return (jax.random.normal(k, shape, jnp.float32) * (shape[0] ** -0.5)).astype(dtype)
        hd = d // heads
        L = layers
        blocks = {"wq": w(ks[0], (L, d, heads * hd)), "wk": w(ks[1], (L, d, kv_heads * hd)),
                  "wv": w(ks[2], (L, d, kv_heads * hd)), "wo": w(ks[3], (L, heads * hd, d)),
                  "w1": w(ks[4], (L, d, ffn)), "w3": w(ks[5], (L, d, ffn)), "w2": w(ks[6], (L, ffn, d)),
                  "n1": jnp.ones((L, d), dtype), "n2": jnp.ones((L, d), dtype)}
        return {"emb": w(ks[7], (vocab, d)), "blocks": blocks, "nf": jnp.ones((d,), dtype)}

    def rms(x, g):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(dtype) * g

    def rope(x):
        T, hd = x.shape[1], x.shape[-1]
        inv = 1.0 / (10000 ** (jnp.arange(0, hd, 2) / hd))
        ang = jnp.arange(T)[:, None] * inv[None]
        c, s = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
        x1, x2 = x[..., ::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
        return jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(x.shape).astype(dtype)

    def block(h, p):
        B, T, _ = h.shape
        hd = d // heads
        n = rms(h, p["n1"])
        q = rope((n @ p["wq"]).reshape(B, T, heads, hd))
        kk = rope((n @ p["wk"]).reshape(B, T, kv_heads, hd))
        v = (n @ p["wv"]).reshape(B, T, kv_heads, hd)
        rep = heads // kv_heads
        kk, v = jnp.repeat(kk, rep, 2), jnp.repeat(v, rep, 2)
        s = jnp.einsum("bthd,bshd->bhts", q, kk).astype(jnp.float32) / hd ** 0.5
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
        a = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1).astype(dtype), v).reshape(B, T, d)
        h = h + a @ p["wo"]
        n = rms(h, p["n2"])
        return h + (jax.nn.silu(n @ p["w1"]) * (n @ p["w3"])) @ p["w2"]

    def fwd(params, x):
        h = params["emb"][x]
        if scan:
            h, _ = jax.lax.scan(lambda c, p: (block(c, p), None), h, params["blocks"])
        else:
            for i in range(layers):
                h = block(h, jax.tree.map(lambda t: t[i], params["blocks"]))
        return (rms(h, params["nf"]) @ params["emb"].T).astype(jnp.float32)

    def loss(params, x):
        lg = fwd(params, x[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(lg), x[:, 1:, None], -1))

    if opt is None:
        import optax
        opt = optax.adamw(1e-3)

    def train_step(state, x):
        params, ostate = state
        l, g = jax.value_and_grad(loss)(params, x)
        upd, ostate = opt.update(g, ostate, params)
        # optax.apply_updates: each sum in its parameter's dtype.
        new = jax.tree.map(lambda p, u: jnp.asarray(p + u).astype(jnp.asarray(p).dtype), params, upd)
        return (new, ostate), l

    def make_state(key):
        p = init(key)
        return (p, opt.init(p))

    return make_state, train_step


def build(name):
    """(make_state, train_step, batch, seq, vocab) for a named config."""
    vocab, d, heads, kv, layers, ffn, dtype, scan, batch, seq = CONFIGS[name]
    ms, st = make_llama(vocab, d, heads, kv, layers, ffn, dtype, scan)
    return ms, st, batch, seq, vocab
