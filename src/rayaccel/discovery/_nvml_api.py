"""The slice of nvidia-ml-py's ``pynvml`` API that :mod:`.fakenvml` mimics: constants,
error classes and ctypes structures, with NVML's own values and layouts.

Kept apart from the fake's behaviour so :mod:`.fakenvml` holds only the model.
"""

from __future__ import annotations

import ctypes

# ---------------------------------------------------------------- constants (values as in NVML)
NVML_SUCCESS = 0
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
# nvmlNvlinkVersion_t (what nvmlDeviceGetNvLinkVersion returns)
NVML_NVLINK_VERSION_INVALID = 0
NVML_NVLINK_VERSION_1_0 = 1
NVML_NVLINK_VERSION_2_0 = 2
NVML_NVLINK_VERSION_2_2 = 3
NVML_NVLINK_VERSION_3_0 = 4
NVML_NVLINK_VERSION_3_1 = 5
NVML_NVLINK_VERSION_4_0 = 6
NVML_NVLINK_VERSION_5_0 = 7
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
# ECC counters (nvmlMemoryErrorType_t, nvmlEccCounterType_t) for nvmlDeviceGetTotalEccErrors
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
# nvmlGpuP2PCapsIndex_t / nvmlGpuP2PStatus_t (nvmlDeviceGetP2PStatus)
NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_CAPS_INDEX_ATOMICS = 3
NVML_P2P_CAPS_INDEX_PCI = 4
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_P2P_STATUS_UNKNOWN = 6
# nvmlGpuFabricState_t (nvmlDeviceGetGpuFabricInfo[V]) and the v2 struct's version word
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE = 1
NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE = 2
NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW = 0
NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW = 0x3
NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY = 1
NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY = 2
NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY = 3
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlGpuFabricInfo_v3 = 0x3000028

# nvmlEventType* bit masks (nvmlDeviceRegisterEvents / nvmlEventSetWait)
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypePowerSourceChange = 0x0000000000000080
nvmlEventMigConfigChange = 0x0000000000000100
nvmlEventTypeSingleBitEccErrorStorm = 0x0000000000000200
nvmlEventTypeDramRetirementEvent = 0x0000000000000400
nvmlEventTypeDramRetirementFailure = 0x0000000000000800
nvmlEventTypeNonFatalPoisonError = 0x0000000000001000
nvmlEventTypeFatalPoisonError = 0x0000000000002000
nvmlEventTypeGpuUnavailableError = 0x0000000000004000
nvmlEventTypeGpuRecoveryAction = 0x0000000000008000
nvmlEventTypeNone = 0x0000000000000000

# nvmlClocksEventReason* (nvmlDeviceGetCurrentClocksEventReasons; the older
# nvmlClocksThrottleReason* names carry the same bits)
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown

_ERRORS = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11, "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14, "GPU_IS_LOST": 15, "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17, "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20,
    "NO_DATA": 21, "VGPU_ECC_NOT_SUPPORTED": 22, "INSUFFICIENT_RESOURCES": 23, "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25, "DEPRECATED": 26, "NOT_READY": 27, "GPU_NOT_FOUND": 28, "INVALID_STATE": 29,
    "RESET_TYPE_NOT_SUPPORTED": 30, "UNKNOWN": 999,
}
for _n, _v in _ERRORS.items():
    globals()[f"NVML_ERROR_{_n}"] = _v


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: ``.value`` is the NVML return code;
    ``NVMLError(code)`` builds the matching subclass (``NVMLError_NotSupported`` ...)."""

    _by_value: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in _ERRORS.items()}
        return names.get(self.value, f"NVML error {self.value}").replace("_", " ").title()


_ERROR_CLASSES: dict[str, type] = {}
for _n, _v in _ERRORS.items():
    _cls_name = "NVMLError_" + "".join(p.capitalize() for p in _n.split("_"))
    _cls = type(_cls_name, (NVMLError,), {})
    NVMLError._by_value[_v] = _cls
    _ERROR_CLASSES[_cls_name] = _cls


# ---------------------------------------------------------------- ctypes structures (layouts as in nvidia-ml-py)
class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class struct_c_nvmlGpuInstance_t(ctypes.Structure):
    pass


c_nvmlGpuInstance_t = ctypes.POINTER(struct_c_nvmlGpuInstance_t)


class c_nvmlGpuInstanceInfo_t(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("placement", c_nvmlGpuInstancePlacement_t)]


class c_nvmlGpuInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("isP2pSupported", ctypes.c_uint),
                ("sliceCount", ctypes.c_uint), ("instanceCount", ctypes.c_uint),
                ("multiprocessorCount", ctypes.c_uint), ("copyEngineCount", ctypes.c_uint),
                ("decoderCount", ctypes.c_uint), ("encoderCount", ctypes.c_uint), ("jpegCount", ctypes.c_uint),
                ("ofaCount", ctypes.c_uint), ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96)]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class c_nvmlDeviceAttributes(ctypes.Structure):
    _fields_ = [("multiprocessorCount", ctypes.c_uint), ("sharedCopyEngineCount", ctypes.c_uint),
                ("sharedDecoderCount", ctypes.c_uint), ("sharedEncoderCount", ctypes.c_uint),
                ("sharedJpegCount", ctypes.c_uint), ("sharedOfaCount", ctypes.c_uint),
                ("gpuInstanceSliceCount", ctypes.c_uint), ("computeInstanceSliceCount", ctypes.c_uint),
                ("memorySizeMB", ctypes.c_ulonglong)]


class c_nvmlEventData_t(ctypes.Structure):
    """What ``nvmlEventSetWait_v2`` returns (pynvml's layout; ``device`` is the device handle)."""

    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint),
                ("healthMask", ctypes.c_uint32)]

    def __init__(self, **kw):
        kw.setdefault("version", nvmlGpuFabricInfo_v2)
        super().__init__(**kw)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint),
                ("healthMask", ctypes.c_uint32), ("healthSummary", ctypes.c_uint8)]

    def __init__(self, **kw):
        kw.setdefault("version", nvmlGpuFabricInfo_v3)
        super().__init__(**kw)


def _pci_info(bus_id: str) -> nvmlPciInfo_t:
    domain, bus, rest = (bus_id.split(":") + ["0", "0", "0"])[:3]
    info = nvmlPciInfo_t(busId=bus_id.encode(), busIdLegacy=bus_id[-12:].encode())
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0] or "0", 16)
    return info


#: Every public name, so the fake module re-exports them (``fakenvml.NVML_ERROR_TIMEOUT``).
__all__ = sorted(n for n in globals() if n.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlPciInfo_t",
                                                         "struct_c_nvml", "nvmlEvent", "nvmlClocks",
                                                         "nvmlGpuFabricInfo_v")) or n in ("_ERRORS", "_ERROR_CLASSES",
                                                                                    "_pci_info"))
