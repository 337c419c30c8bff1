-- Argo CD health check for specfleet.io/SpeculativeDeployment (Lua 5.1, as Argo CD runs it).
-- Degraded: the Degraded condition is True (its reason and message are shown).
-- Progressing: no status yet, an older generation reconciled, a rollout or speculation flip under
--   way (a flip is a surge rollout: Progressing, never Degraded), or engines still getting ready.
-- Healthy: Ready is True and nothing is rolling out.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the specfleet operator to report status"
  return hs
end
local conditions = {}
for _, condition in ipairs(obj.status.conditions) do
  if condition.type ~= nil then
    conditions[condition.type] = condition
  end
end
local function holds(type, status)
  return conditions[type] ~= nil and conditions[type].status == status
end
local function text(condition)
  local message = condition.message or ""
  if condition.reason ~= nil and condition.reason ~= "" then
    if message == "" then
      return condition.reason
    end
    return condition.reason .. ": " .. message
  end
  return message
end
if holds("Degraded", "True") then
  hs.status = "Degraded"
  hs.message = text(conditions["Degraded"])
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile generation " .. tostring(generation)
  return hs
end
if holds("Progressing", "True") then
  hs.status = "Progressing"
  hs.message = text(conditions["Progressing"])
  return hs
end
if holds("SpeculationSettled", "False") then
  hs.status = "Progressing"
  hs.message = text(conditions["SpeculationSettled"])
  return hs
end
if holds("Ready", "True") then
  hs.status = "Healthy"
  hs.message = conditions["Ready"].message or ""
  if holds("MetricsAvailable", "False") then
    hs.message = hs.message .. "; the speculation policy holds: " .. text(conditions["MetricsAvailable"])
  end
  return hs
end
hs.status = "Progressing"
if conditions["Ready"] ~= nil then
  hs.message = text(conditions["Ready"])
else
  hs.message = "Waiting for the Ready condition"
end
return hs
