#pragma once
/// \file
/// Operators on distributed tensors with their sharding rules (`xshard::ops`: matmul,
/// elementwise, reductions, normalisations, shape, vocabulary-parallel embedding), and
/// `shard()` / `shard_local()`, which wrap any callable (MindSpore's semi-auto parallel).

#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/embedding.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/rules.hpp>
#include <xshard/ops/shape.hpp>
#include <xshard/shard/shard.hpp>
