#pragma once
/// \file
/// Ready networks: ResNet, the MLP and GPT-style decoder whose per-operator strategies the
/// search sets at run time, with their operators, and the transformer block and ResNet
/// written as programs (models/transformer.hpp, models/resnet.hpp).

#include <xshard/models/resnet.hpp>
#include <xshard/models/searched_mlp.hpp>
#include <xshard/models/searched_model.hpp>
#include <xshard/models/searched_ops.hpp>
#include <xshard/models/searched_transformer.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn/resnet.hpp>
