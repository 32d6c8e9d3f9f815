"""IR passes, one per file; `default_passes` is the order the compiler runs them in."""

from ctxrt.ir.passes.base import Pass, PassResult, run_passes
from ctxrt.ir.passes.eliminate import EliminateDead, EliminateIdentity
from ctxrt.ir.passes.fold_affine import FoldChannelAffine
from ctxrt.ir.passes.fold_bn import FoldBatchNormIntoConv
from ctxrt.ir.passes.fold_transpose import FoldTransposeIntoMatMul
from ctxrt.ir.passes.fuse_activation import FuseActivation
from ctxrt.ir.passes.fuse_gelu import FuseGelu
from ctxrt.ir.passes.fuse_rms import FuseRms
from ctxrt.ir.passes.fuse_silu import FuseHardGates, FuseSilu
from ctxrt.ir.passes.transpose_weights import TransposeMatMulWeights


def default_passes(in_memory: bool = False, fuse_rms: bool = True) -> list[Pass]:
    """`in_memory`: the program runs from memory, not a binary (weights mapped from a model's file stay there);
    `fuse_rms`: the backend runs RMSNormalization itself."""
    # (FuseHardGates before FoldChannelAffine, which would fold a gate's Add into the conv before it; FoldChannelAffine
    # before FoldBatchNormIntoConv: a ConvTranspose's bias Add between it and its BN, PP-OCR det's, is folded first)
    return [EliminateIdentity(), FuseHardGates(), FoldChannelAffine(), FoldBatchNormIntoConv(), FuseActivation(),
            FuseGelu(), FuseSilu(), *([FuseRms()] if fuse_rms else []), FoldTransposeIntoMatMul(),
            EliminateDead(), TransposeMatMulWeights(keep_mapped=in_memory)]


__all__ = ["Pass", "PassResult", "run_passes", "default_passes", "EliminateDead", "EliminateIdentity",
           "FoldBatchNormIntoConv", "FoldChannelAffine", "FoldTransposeIntoMatMul", "FuseActivation", "FuseGelu",
           "FuseHardGates", "FuseRms", "FuseSilu", "TransposeMatMulWeights"]
