#pragma once
/// \file
/// Ready networks: ResNet of layers (nn/resnet.hpp), and the transformer block and ResNet
/// written as programs (models/transformer.hpp, models/resnet.hpp).

#include <xshard/models/resnet.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn/resnet.hpp>
