"""Optional compiled CPU kernels (csrc/, built on first use) and the compiled decode stack."""
