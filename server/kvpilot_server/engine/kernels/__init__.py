"""Optional compiled CPU kernels (csrc/, built on first use), the operands layers hand them, and
the compiled decode stack."""
