#pragma once
/// \file
/// Operators on distributed tensors with their sharding rules (`xshard::ops`: matmul,
/// elementwise, reductions, normalisations, shape, vocabulary-parallel embedding), and
/// `shard()` / `shard_local()`, which wrap any callable (MindSpore's semi-auto parallel).

#include <xshard/ops/annotated.hpp>
#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/embedding.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/rules.hpp>
#include <xshard/ops/shape.hpp>
#include <xshard/shard/derivation.hpp>
#include <xshard/shard/inputs.hpp>
#include <xshard/shard/options.hpp>
#include <xshard/shard/outputs.hpp>
#include <xshard/shard/plan_cache.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/shard.hpp>
#include <xshard/shard/sharded.hpp>
#include <xshard/shard/spec.hpp>
#include <xshard/shard/vjp.hpp>
