"""STAND-IN for ``habitat_sim.sensor``: sensor types and specifications (no rendering here)."""

import enum

from ._config import ConfigStruct

from standin_placeholders import placeholder_module

__all__ = ["SensorType", "SensorSubType", "FisheyeSensorModelType", "SensorSpec",
           "CameraSensorSpec", "EquirectangularSensorSpec", "FisheyeSensorDoubleSphereSpec"]


class SensorType(enum.IntEnum):
    NONE = 0
    COLOR = 1
    DEPTH = 2
    NORMAL = 3
    SEMANTIC = 4
    PATH = 5
    GOAL = 6
    FORCE = 7
    TENSOR = 8
    TEXT = 9
    AUDIO = 10


class SensorSubType(enum.IntEnum):
    NONE = 0
    PINHOLE = 1
    ORTHOGRAPHIC = 2
    FISHEYE = 3
    EQUIRECTANGULAR = 4


class FisheyeSensorModelType(enum.IntEnum):
    DOUBLE_SPHERE = 0


class SensorSpec(ConfigStruct):
    _defaults = {"uuid": "", "sensor_type": SensorType.NONE,
                 "sensor_subtype": SensorSubType.NONE, "position": lambda: [0.0, 1.5, 0.0],
                 "orientation": lambda: [0.0, 0.0, 0.0], "resolution": lambda: [128, 128],
                 "noise_model": "None", "gpu2gpu_transfer": False}


class CameraSensorSpec(SensorSpec):
    _defaults = {**SensorSpec._defaults, "sensor_subtype": SensorSubType.PINHOLE, "hfov": 90.0,
                 "near": 0.01, "far": 1000.0}


class EquirectangularSensorSpec(SensorSpec):
    _defaults = {**SensorSpec._defaults, "sensor_subtype": SensorSubType.EQUIRECTANGULAR}


class FisheyeSensorDoubleSphereSpec(SensorSpec):
    _defaults = {**SensorSpec._defaults, "sensor_subtype": SensorSubType.FISHEYE}


__getattr__ = placeholder_module("habitat_sim.sensor")
