"""GPU check of the Triton decode kernel (bf16): its output against `decode_attention_reference`, and
the cache it writes (the new token's K/V at position used-1, nothing else), byte for byte.

    PYTHONPATH=. python benchmarks/decode_attention_check.py     # prints KVCHECK OK / FAIL
"""
import torch

from codechat.engine.attention import decode_attention, decode_attention_reference


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention_check.py needs CUDA")
    torch.manual_seed(0)
    ok = True
    for b, H, Hkv, D, P in [(64, 10, 10, 128, 513), (1, 10, 10, 128, 513), (7, 16, 4, 64, 300)]:
        kc = torch.randn(b + 2, P, Hkv, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q = torch.randn(b, H, D, device="cuda", dtype=torch.bfloat16)
        qkv = torch.randn(b, H + 2 * Hkv, D, device="cuda", dtype=torch.bfloat16)
        k, v = qkv[:, H:H + Hkv], qkv[:, H + Hkv:]
        used = torch.randint(1, P + 1, (b,), device="cuda")
        used[0], used[-1] = 1, P
        kc2, vc2 = kc.clone(), vc.clone()
        ref = decode_attention_reference(q, k, v, kc2, vc2, used)
        for splits in (None, 1, 5):
            kc3, vc3 = kc.clone(), vc.clone()
            out = decode_attention(q, k, v, kc3, vc3, used, splits=splits)
            err = float((out.float() - ref.float()).abs().max())
            same = torch.equal(kc3, kc2) and torch.equal(vc3, vc2)
            print(f"b{b} H{H}/{Hkv} D{D} P{P} splits {splits}: max err {err:.4f}, cache equal {same}")
            ok &= err < 0.05 and same
    print("KVCHECK", "OK" if ok else "FAIL")


if __name__ == "__main__":
    main()
